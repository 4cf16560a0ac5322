//! Files through the editor: when the client advertises
//! `fs.readTextFile` / `fs.writeTextFile`, `read_file` and `write_file`
//! (and `apply_diff`, given both) read and write through it
//! (`fs/read_text_file`, `fs/write_text_file`), so the model sees unsaved
//! buffers and its writes land in them. The
//! tools keep the built-in ones' names, arguments and sandbox (paths stay
//! under the session's cwd).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_client_protocol::Client;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{ReadTextFileRequest, SessionId, WriteTextFileRequest};
use async_trait::async_trait;
use serde::Deserialize;
use serde_json::Value;
use toolwire_tools::builtin::{Workspace, parse_args, preview_diff};
use toolwire_tools::{Tool, ToolContext, ToolError, ToolOutput, ToolSpec};

/// Text returned by one read, at most (the built-in tool's cap is alike).
const MAX_READ: usize = 256 * 1024;

/// The editor side of a session's files.
#[derive(Clone)]
pub(crate) struct ClientFs {
    pub cx: ConnectionTo<Client>,
    pub session_id: SessionId,
    pub read: bool,
    pub write: bool,
    /// The built-in tools' sandbox, and what they wrote (for the file
    /// watcher).
    pub workspace: Arc<Workspace>,
    /// The session's cwd as the editor gave it.
    pub cwd: PathBuf,
}

impl ClientFs {
    /// Reads `path` (resolved in the sandbox) from the editor.
    async fn read(
        &self,
        path: &Path,
        line: Option<u32>,
        limit: Option<u32>,
    ) -> Result<String, agent_client_protocol::Error> {
        let request = ReadTextFileRequest::new(self.session_id.clone(), self.editor_path(path))
            .line(line)
            .limit(limit);
        Ok(self.cx.send_request(request).block_task().await?.content)
    }

    /// Writes `text` to `path` (resolved in the sandbox) in the editor,
    /// unless the call is cancelled first. Recorded as the agent's own
    /// write first, so that the file watcher does not report the editor's
    /// save back to the model as an outside change.
    async fn write(
        &self,
        path: &Path,
        shown: &str,
        text: String,
        ctx: &ToolContext,
    ) -> Result<(), ToolError> {
        let own_writes = self.workspace.own_writes();
        own_writes.record(path, text.as_bytes());
        let request =
            WriteTextFileRequest::new(self.session_id.clone(), self.editor_path(path), text);
        let written = self.cx.send_request(request).block_task();
        let result = tokio::select! {
            written = written => written.map(drop).map_err(|e| {
                ToolError::Failed(format!("the editor could not write `{shown}`: {}", e.message))
            }),
            () = ctx.cancel.cancelled() => Err(ToolError::Cancelled),
        };
        if result.is_err() {
            own_writes.forget(path);
        }
        result
    }

    /// The file a call names, checked against the sandbox, as a path and
    /// as shown to the model; reported as the call's location (by the
    /// editor's name for it).
    fn target(
        &self,
        path: &str,
        line: Option<u32>,
        ctx: &ToolContext,
    ) -> Result<(PathBuf, String), ToolError> {
        let path = self.workspace.resolve(path)?;
        ctx.progress.report(toolwire_core::Progress::Locations {
            locations: vec![toolwire_core::Location {
                path: self.editor_path(&path).display().to_string(),
                line,
            }],
        });
        let shown = self.workspace.display(&path);
        Ok((path, shown))
    }

    fn editor_path(&self, resolved: &Path) -> PathBuf {
        editor_path(&self.cwd, &self.workspace, resolved)
    }

    /// The text of a file the user linked in a prompt, as the editor has
    /// it (its buffer, saved or not), at most [`MAX_READ`] bytes. The path
    /// is the editor's own: the user chose it there.
    pub(crate) async fn read_linked(
        &self,
        path: &Path,
    ) -> Result<String, agent_client_protocol::Error> {
        let request = ReadTextFileRequest::new(self.session_id.clone(), path.to_path_buf());
        let mut text = self.cx.send_request(request).block_task().await?.content;
        if text.len() > MAX_READ {
            let mut cut = MAX_READ;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push_str("\n[cut: the file is longer]");
        }
        Ok(text)
    }
}

/// `resolved` (canonical, in the sandbox) as the editor names it: under
/// the cwd it gave, which may be a symlink to the sandbox's root (macOS's
/// `/tmp`, a linked project folder). The editor knows its buffers by
/// those names; the canonical one would look like a file outside its
/// project.
pub(crate) fn editor_path(cwd: &Path, workspace: &Workspace, resolved: &Path) -> PathBuf {
    match resolved.strip_prefix(workspace.root()) {
        // Joining nothing would add a trailing `/`.
        Ok(rest) if rest.as_os_str().is_empty() => cwd.to_path_buf(),
        Ok(rest) => cwd.join(rest),
        Err(_) => resolved.to_path_buf(),
    }
}

/// What an edit preview can show of the file it would change.
pub(crate) enum OldText {
    /// Its current text.
    Text(String),
    /// No such file: the edit creates it.
    Missing,
    /// Not shown, and why (no diff is shown then).
    Unavailable(String),
}

/// Whether the editor's read error `e` means that `path` does not exist:
/// ACP's `-32002` (resource not found), or any error for a file that is
/// not on disk either. Not every client maps a missing file to `-32002`
/// (an SDK answers a thrown `ENOENT` as `-32603`, internal error); a read
/// error for a file that does exist is never taken as its absence.
async fn is_missing(e: &agent_client_protocol::Error, path: &Path) -> bool {
    if e.code == agent_client_protocol::ErrorCode::RESOURCE_NOT_FOUND {
        return true;
    }
    let absent = matches!(
        tokio::fs::symlink_metadata(path).await,
        Err(io) if io.kind() == std::io::ErrorKind::NotFound
    );
    if absent {
        tracing::debug!(path = %path.display(), error = %e, "the editor could not read a file that is not on disk: taken as missing");
    }
    absent
}

/// The current text of `path` (already resolved in the session's
/// sandbox) for an edit preview: the editor's buffer when it offers reads,
/// else the file on disk. Only a regular file of at most [`MAX_READ`]
/// bytes is read, so that a device, a FIFO or a huge file cannot stall or
/// flood the permission request.
pub(crate) async fn read_for_preview(fs: Option<&ClientFs>, path: &Path) -> OldText {
    let too_large = || OldText::Unavailable(format!("it is larger than {} KiB", MAX_READ / 1024));
    let meta = tokio::fs::metadata(path).await;
    match &meta {
        Ok(m) if !m.is_file() => {
            return OldText::Unavailable("it is not a regular file".into());
        }
        Ok(m) if m.len() > MAX_READ as u64 => return too_large(),
        _ => {}
    }
    if let Some(fs) = fs.filter(|fs| fs.read) {
        return match fs.read(path, None, None).await {
            Ok(text) if text.len() > MAX_READ => too_large(),
            Ok(text) => OldText::Text(text),
            Err(e) if is_missing(&e, path).await => OldText::Missing,
            Err(e) => OldText::Unavailable(format!("the editor could not read it: {}", e.message)),
        };
    }
    match meta {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => OldText::Missing,
        Err(e) => OldText::Unavailable(e.to_string()),
        Ok(_) => {
            // Bounded even if the file grew (or was swapped) since the
            // metadata was read.
            let read = async {
                use tokio::io::AsyncReadExt;
                let file = tokio::fs::File::open(path).await?;
                if !file.metadata().await?.is_file() {
                    return Ok(None);
                }
                let mut bytes = Vec::new();
                file.take(MAX_READ as u64 + 1)
                    .read_to_end(&mut bytes)
                    .await?;
                Ok::<_, std::io::Error>(Some(bytes))
            };
            match tokio::time::timeout(std::time::Duration::from_secs(5), read).await {
                Ok(Ok(Some(bytes))) if bytes.len() > MAX_READ => too_large(),
                Ok(Ok(Some(bytes))) => match String::from_utf8(bytes) {
                    Ok(text) => OldText::Text(text),
                    Err(_) => OldText::Unavailable("it is not UTF-8 text".into()),
                },
                Ok(Ok(None)) => OldText::Unavailable("it is not a regular file".into()),
                Ok(Err(e)) => OldText::Unavailable(e.to_string()),
                Err(_) => OldText::Unavailable("reading it took too long".into()),
            }
        }
    }
}

/// `read_file` through the editor.
pub(crate) struct ClientReadFile {
    pub spec: Arc<ToolSpec>,
    pub fs: ClientFs,
}

#[derive(Deserialize)]
struct ReadArgs {
    path: String,
    #[serde(default)]
    offset: Option<u32>,
    #[serde(default)]
    limit: Option<u32>,
}

#[async_trait]
impl Tool for ClientReadFile {
    fn spec(&self) -> &Arc<ToolSpec> {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: ReadArgs = parse_args(arguments)?;
        if args.offset == Some(0) || args.limit == Some(0) {
            return Err(ToolError::InvalidArguments(
                "offset and limit start at 1 (lines are numbered from 1)".into(),
            ));
        }
        let (path, shown) = self.fs.target(&args.path, args.offset.or(Some(1)), &ctx)?;
        let read = self.fs.read(&path, args.offset, args.limit);
        let mut text = tokio::select! {
            read = read => read.map_err(|e| ToolError::Failed(format!("the editor could not read `{shown}`: {}", e.message)))?,
            () = ctx.cancel.cancelled() => return Err(ToolError::Cancelled),
        };
        if text.len() > MAX_READ {
            let cut = text.floor_char_boundary(MAX_READ);
            let line =
                text[..cut].matches('\n').count() as u64 + u64::from(args.offset.unwrap_or(1));
            text.truncate(cut);
            text.push_str(&format!(
                "\n[truncated: output is capped at {} KiB and was cut in line {line}; call again with offset={line} to continue]",
                MAX_READ / 1024
            ));
        }
        Ok(ToolOutput::ok(text))
    }
}

/// `write_file` through the editor.
pub(crate) struct ClientWriteFile {
    pub spec: Arc<ToolSpec>,
    pub fs: ClientFs,
}

#[derive(Deserialize)]
struct WriteArgs {
    path: String,
    content: String,
}

#[async_trait]
impl Tool for ClientWriteFile {
    fn spec(&self) -> &Arc<ToolSpec> {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: WriteArgs = parse_args(arguments)?;
        let (path, shown) = self.fs.target(&args.path, None, &ctx)?;
        let bytes = args.content.len();
        self.fs.write(&path, &shown, args.content, &ctx).await?;
        Ok(ToolOutput::ok(format!(
            "wrote `{shown}` in the editor: {bytes} bytes"
        )))
    }
}

/// `apply_diff` through the editor: its buffer is the old text, the
/// patched text goes back to it.
pub(crate) struct ClientApplyDiff {
    pub spec: Arc<ToolSpec>,
    pub fs: ClientFs,
}

#[derive(Deserialize)]
struct DiffArgs {
    path: String,
    diff: String,
}

#[async_trait]
impl Tool for ClientApplyDiff {
    fn spec(&self) -> &Arc<ToolSpec> {
        &self.spec
    }

    async fn call(&self, arguments: Value, ctx: ToolContext) -> Result<ToolOutput, ToolError> {
        let args: DiffArgs = parse_args(arguments)?;
        let (path, shown) = self.fs.target(&args.path, None, &ctx)?;
        // A missing file counts as empty: a diff that creates it starts
        // from nothing, any other fails to apply. Any other error is not
        // an empty file.
        let read = self.fs.read(&path, None, None);
        let old = tokio::select! {
            read = read => match read {
                Ok(text) => text,
                Err(e) if is_missing(&e, &path).await => String::new(),
                Err(e) => {
                    return Err(ToolError::Failed(format!(
                        "`{shown}` unchanged: the editor could not read it: {}",
                        e.message
                    )));
                }
            },
            () = ctx.cancel.cancelled() => return Err(ToolError::Cancelled),
        };
        let new = preview_diff(&old, &args.diff)
            .map_err(|e| ToolError::Failed(format!("`{shown}` unchanged: {e}")))?;
        self.fs.write(&path, &shown, new, &ctx).await?;
        Ok(ToolOutput::ok(format!(
            "applied the diff to `{shown}` in the editor"
        )))
    }
}
