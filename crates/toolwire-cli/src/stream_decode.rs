//! `toolwire stream decode`: replays a recorded stream through a decoder.

use std::io::{BufWriter, Read, Write};
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use toolwire_stream::{Format, OffsetEvent, StreamEvent, decode_chunked};

#[derive(Debug, Args)]
pub struct DecodeArgs {
    /// Wire format of the recording.
    #[arg(long, value_enum)]
    format: FormatArg,
    /// Feed the input in chunks of this many bytes (default: all at once).
    /// `--chunk-size 1` shows the earliest moment each event can be known.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    chunk_size: Option<u64>,
    /// The recorded stream; standard input if omitted.
    file: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum FormatArg {
    /// OpenAI chat completions SSE (also a plain JSON completion).
    OpenaiChat,
    /// OpenAI responses API SSE.
    OpenaiResponses,
    /// Anthropic messages SSE.
    Anthropic,
    /// Plain text with <tool_call> XML.
    Xml,
}

impl From<FormatArg> for Format {
    fn from(f: FormatArg) -> Self {
        match f {
            FormatArg::OpenaiChat => Format::OpenAiChat,
            FormatArg::OpenaiResponses => Format::OpenAiResponses,
            FormatArg::Anthropic => Format::Anthropic,
            FormatArg::Xml => Format::Xml,
        }
    }
}

/// One output line: the event's own fields plus `offset`.
#[derive(Serialize)]
struct Line<'a> {
    #[serde(flatten)]
    event: &'a StreamEvent,
    offset: usize,
}

pub fn run(args: &DecodeArgs) -> Result<()> {
    let input = read_input(args.file.as_ref())?;
    let chunk = match args.chunk_size {
        Some(n) => Some(usize::try_from(n).context("--chunk-size is too large")?),
        None => None,
    };
    let events = decode_chunked(args.format.into(), &input, chunk);
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    for OffsetEvent { offset, event } in &events {
        serde_json::to_writer(
            &mut out,
            &Line {
                event,
                offset: *offset,
            },
        )?;
        out.write_all(b"\n")?;
    }
    out.flush().context("writing to standard output")?;
    Ok(())
}

fn read_input(file: Option<&PathBuf>) -> Result<Vec<u8>> {
    match file {
        Some(path) => std::fs::read(path).with_context(|| format!("reading {}", path.display())),
        None => {
            let mut buf = Vec::new();
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("reading standard input")?;
            Ok(buf)
        }
    }
}
