//! `read_file`: text of a file in the workspace, a window of lines at a time.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Deserialize;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read as _};

use super::Workspace;
use super::common::{looks_binary, parse_args, report_location, spec};
use super::workspace::{Node, io_error};
use crate::{Tool, ToolContext, ToolError, ToolImage, ToolOutput, ToolSpec};
use toolwire_core::MAX_IMAGE_BYTES;

/// Caps what one call puts into the model's context.
const MAX_BYTES: usize = 256 * 1024;
/// Bounds memory when a file has one enormous line.
const CHUNK: u64 = 64 * 1024;

pub struct ReadFile {
    workspace: Arc<Workspace>,
    spec: Arc<ToolSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    path: String,
    #[serde(default)]
    offset: Option<u64>,
    #[serde(default)]
    limit: Option<u64>,
}

impl ReadFile {
    pub fn new(workspace: Arc<Workspace>) -> Self {
        let parameters = json!({
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File path, relative to the workspace root (or absolute inside it)."},
                "offset": {"type": "integer", "minimum": 1, "description": "First line to return (1-based). Default 1."},
                "limit": {"type": "integer", "minimum": 1, "description": "Maximum number of lines to return."}
            },
            "required": ["path"],
            "additionalProperties": false
        });
        let description = "Reads a UTF-8 text file from the workspace. Returns at most 256 KiB; \
            when the output is cut, a note at the end says which offset continues. \
            PNG, JPEG, GIF and WebP images (up to 5 MiB) are returned as images; \
            other binary files are refused.";
        ReadFile {
            workspace,
            spec: spec("read_file", description, parameters, true),
        }
    }
}

#[async_trait]
impl Tool for ReadFile {
    fn spec(&self) -> &Arc<ToolSpec> {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: Args = parse_args(arguments)?;
        if args.offset == Some(0) || args.limit == Some(0) {
            return Err(ToolError::InvalidArguments(
                "offset and limit start at 1 (lines are numbered from 1)".into(),
            ));
        }
        let at = self.workspace.locate(&args.path)?;
        let progress = ctx.progress.clone();
        let window = Window {
            first: args.offset.unwrap_or(1),
            limit: args.limit,
        };
        self.workspace
            .blocking(move |workspace| {
                let shown = at.shown.as_str();
                let (file, len) = match workspace.open_node(&at)? {
                    Node::File(file, len) => (file, len),
                    Node::Dir(_) => {
                        return Err(ToolError::Refused(format!(
                            "`{shown}` is a directory; use list_dir to see its entries"
                        )));
                    }
                };
                report_location(&progress, &at.abs, args.offset);
                let io = |e| io_error(shown, e);
                let mut reader = BufReader::new(file);
                let start = reader.fill_buf().map_err(io)?;
                // An image by its first bytes, whatever its name: the
                // model is shown the image itself.
                if let Some(media_type) = toolwire_core::image::sniff(start) {
                    return read_image(reader, shown, media_type, len);
                }
                if looks_binary(start) {
                    return Err(not_text(shown));
                }
                let read = window.read(&mut reader).map_err(io)?;
                read.into_output(shown, &window)
            })
            .await
    }
}

/// The whole image, refused over [`MAX_IMAGE_BYTES`] (by the file's
/// length, `len`, before reading, and by what was read: it may grow).
fn read_image<R: BufRead>(
    reader: R,
    shown: &str,
    media_type: &str,
    len: u64,
) -> Result<ToolOutput, ToolError> {
    if len > MAX_IMAGE_BYTES as u64 {
        let e = toolwire_core::ImageError::TooLarge {
            bytes: usize::try_from(len).unwrap_or(usize::MAX),
            limit: MAX_IMAGE_BYTES,
        };
        return Err(ToolError::Refused(format!("`{shown}`: {e}")));
    }
    let mut bytes = Vec::new();
    reader
        .take(MAX_IMAGE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(shown, e))?;
    let image = ToolImage::new(bytes, Some(media_type))
        .map_err(|e| ToolError::Refused(format!("`{shown}`: {e}")))?;
    let text = format!(
        "`{shown}`: {media_type} image, {}",
        toolwire_core::image::human_size(image.bytes().len() as u64)
    );
    Ok(ToolOutput::ok(text).with_images(vec![image]))
}

fn not_text(shown: &str) -> ToolError {
    ToolError::Refused(format!(
        "`{shown}` is not UTF-8 text (binary file?); read_file only returns text"
    ))
}

struct Window {
    first: u64,
    limit: Option<u64>,
}

/// Why reading stopped before the end of the file.
enum Stop {
    End,
    /// The line limit was reached; this line comes next.
    Limit(u64),
    /// The byte cap was hit inside this line.
    Cap(u64),
}

struct Read {
    bytes: Vec<u8>,
    /// Lines seen (a last line without newline counts).
    lines: u64,
    stop: Stop,
}

impl Window {
    fn read<R: BufRead>(&self, reader: &mut R) -> std::io::Result<Read> {
        let mut bytes = Vec::new();
        let mut buf = Vec::new();
        let mut line = 1u64;
        let mut mid_line = false;
        loop {
            buf.clear();
            if (&mut *reader).take(CHUNK).read_until(b'\n', &mut buf)? == 0 {
                let lines = if mid_line { line } else { line - 1 };
                return Ok(Read {
                    bytes,
                    lines,
                    stop: Stop::End,
                });
            }
            if line >= self.first {
                if self.limit.is_some_and(|limit| line - self.first >= limit) {
                    return Ok(Read {
                        bytes,
                        lines: line,
                        stop: Stop::Limit(line),
                    });
                }
                let room = MAX_BYTES - bytes.len();
                if buf.len() > room {
                    bytes.extend_from_slice(&buf[..room]);
                    return Ok(Read {
                        bytes,
                        lines: line,
                        stop: Stop::Cap(line),
                    });
                }
                bytes.extend_from_slice(&buf);
            }
            mid_line = buf.last() != Some(&b'\n');
            if !mid_line {
                line += 1;
            }
        }
    }
}

impl Read {
    fn into_output(self, shown: &str, window: &Window) -> Result<ToolOutput, ToolError> {
        if window.first > 1 && self.lines < window.first {
            return Err(ToolError::Failed(format!(
                "offset {} is past the end of `{shown}`, which has {} lines",
                window.first, self.lines
            )));
        }
        let cut = matches!(self.stop, Stop::Cap(_));
        let mut text = match String::from_utf8(self.bytes) {
            Ok(text) => text,
            // The cap may split a character; that is not a sign of binary.
            Err(e) if cut && e.utf8_error().error_len().is_none() => {
                let valid = e.utf8_error().valid_up_to();
                let mut bytes = e.into_bytes();
                bytes.truncate(valid);
                String::from_utf8(bytes).map_err(|_| not_text(shown))?
            }
            Err(_) => return Err(not_text(shown)),
        };
        let note = match self.stop {
            Stop::End => None,
            Stop::Limit(next) => Some(format!(
                "[showing lines {}-{} of `{shown}`; more lines follow, call again with offset={next}]",
                window.first,
                next - 1
            )),
            Stop::Cap(line) => Some(format!(
                "[truncated: output is capped at {} KiB and was cut in line {line}; call again with offset={line} to continue]",
                MAX_BYTES / 1024
            )),
        };
        if let Some(note) = note {
            if !text.ends_with('\n') {
                text.push('\n');
            }
            text.push_str(&note);
        }
        Ok(ToolOutput::ok(text))
    }
}
