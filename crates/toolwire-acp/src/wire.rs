//! The client's bytes as JSON-RPC lines. The protocol crate's own reader
//! (`ByteStreams`) ends the connection at the first byte that is not
//! UTF-8, so stdin is split into lines here: a line that is not UTF-8
//! becomes one that is not JSON (saying what was wrong), which the
//! protocol answers with a JSON-RPC parse error (-32700), and the agent
//! reads on.

use futures::{Sink, Stream};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

/// Each line of `input` (without its `\n` or `\r\n`), a line that is not
/// UTF-8 replaced by a description of the fault.
pub(crate) fn lines(
    input: impl AsyncRead + Send + Unpin + 'static,
) -> impl Stream<Item = std::io::Result<String>> + Send + 'static {
    futures::stream::unfold(BufReader::new(input), |mut reader| async move {
        let mut bytes = Vec::new();
        match reader.read_until(b'\n', &mut bytes).await {
            Ok(0) => None,
            Ok(_) => Some((Ok(decode(bytes)), reader)),
            Err(e) => Some((Err(e), reader)),
        }
    })
}

/// The line's text; for bytes that are not UTF-8, a text that is not JSON
/// either, naming the fault (the parse error's `data.line` carries it).
fn decode(mut bytes: Vec<u8>) -> String {
    if bytes.last() == Some(&b'\n') {
        bytes.pop();
        if bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
    }
    let len = bytes.len();
    String::from_utf8(bytes).unwrap_or_else(|e| {
        let at = e.utf8_error().valid_up_to();
        tracing::warn!(
            bytes = len,
            at,
            "a line from the client is not UTF-8: answered with a JSON-RPC parse error"
        );
        format!("invalid UTF-8 at byte {at} of a {len}-byte line")
    })
}

/// Writes each message as one line, flushed.
pub(crate) fn line_sink(
    output: impl AsyncWrite + Send + Unpin + 'static,
) -> impl Sink<String, Error = std::io::Error> + Send + 'static {
    futures::sink::unfold(output, |mut output, line: String| async move {
        let mut bytes = line.into_bytes();
        bytes.push(b'\n');
        output.write_all(&bytes).await?;
        output.flush().await?;
        Ok(output)
    })
}

#[cfg(test)]
mod tests {
    use super::decode;

    #[test]
    fn a_line_that_is_not_utf8_becomes_one_that_is_not_json() {
        let line = decode(b"{\"a\":\"\xff\"}\r\n".to_vec());
        assert_eq!(line, "invalid UTF-8 at byte 6 of a 9-byte line");
        assert!(serde_json::from_str::<serde_json::Value>(&line).is_err());
        assert_eq!(decode(b"{\"a\":1}\n".to_vec()), "{\"a\":1}");
    }
}
