//! The MCP server's stdin/stdout transport: one JSON-RPC message a line, as the SDK's own, but a
//! line that is not a message gets the error reply JSON-RPC 2.0 names instead of silence (the
//! SDK drops text that does not parse, so a client that sent it waits forever):
//! - text that is not JSON, or not Unicode (a lone UTF-16 surrogate, bytes that are not UTF-8):
//!   `-32700` Parse error;
//! - JSON that is not a request, a notification or a response (an `id` that is neither an
//!   integer nor a string, a missing `method`, a batch array): `-32600` Invalid Request.
//!
//! The reply carries the message's `id` when one can be read (a lone surrogate elsewhere in the
//! text leaves the `id` readable), so the client's pending call ends; else `null`, as the spec
//! says. A notification (no `id`) the SDK does not know is dropped, as the SDK does: a
//! notification is never answered. Replies and the SDK's own messages are written whole, one
//! at a time, so they never interleave.

use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::RoleServer;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::Mutex;

/// The longest line read as a message (the SDK's own limit); a longer one is answered with a
/// parse error and skipped.
const MAX_LINE: usize = 16 * 1024 * 1024;

/// JSON-RPC 2.0's error codes.
const PARSE_ERROR: i64 = -32700;
const INVALID_REQUEST: i64 = -32600;

/// Lines in from `R`, messages out to `W`.
pub struct LineTransport<R, W> {
    read: BufReader<R>,
    /// The line read so far (kept across a cancelled `receive`).
    line: Vec<u8>,
    /// Whether the line is past `MAX_LINE` (its bytes are dropped until its end).
    oversized: bool,
    write: Arc<Mutex<W>>,
}

impl<R, W> LineTransport<R, W>
where
    R: tokio::io::AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    pub fn new(read: R, write: W) -> Self {
        LineTransport {
            read: BufReader::new(read),
            line: Vec::new(),
            oversized: false,
            write: Arc::new(Mutex::new(write)),
        }
    }

    /// The next whole line, without its newline, or `None` at the end of input. Cancel-safe:
    /// what was read stays in `self.line`.
    async fn next_line(&mut self) -> Option<std::io::Result<()>> {
        loop {
            let chunk = match self.read.fill_buf().await {
                Ok(chunk) => chunk,
                Err(e) => return Some(Err(e)),
            };
            if chunk.is_empty() {
                // A last line without a newline is still a line.
                return (!self.line.is_empty() || self.oversized).then_some(Ok(()));
            }
            let (part, end) = match chunk.iter().position(|&b| b == b'\n') {
                Some(at) => (&chunk[..at], at + 1),
                None => (chunk, chunk.len()),
            };
            let done = end > part.len();
            if self.line.len() + part.len() > MAX_LINE {
                self.oversized = true;
                self.line.clear();
            } else if !self.oversized {
                self.line.extend_from_slice(part);
            }
            self.read.consume(end);
            if done {
                return Some(Ok(()));
            }
        }
    }
}

/// What to do with one line: hand the SDK a message, answer with an error, or drop it.
#[derive(Debug)]
enum Line {
    Message(Box<RxJsonRpcMessage<RoleServer>>),
    Reply(Value),
    Skip,
}

/// Reads one line as a message for the server.
fn classify(line: &[u8]) -> Line {
    let line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Line::Skip;
    }
    let value: Value = match serde_json::from_slice(line) {
        Ok(value) => value,
        Err(e) => {
            return Line::Reply(error(
                readable_id(line),
                PARSE_ERROR,
                &format!("Parse error: {e}"),
            ))
        }
    };
    let id = value.get("id").cloned();
    let id_ok = id
        .as_ref()
        .is_none_or(|id| id.is_i64() || id.is_u64() || id.is_string());
    if !id_ok {
        return Line::Reply(error(
            Value::Null,
            INVALID_REQUEST,
            "Invalid Request: the id must be an integer or a string",
        ));
    }
    match serde_json::from_value::<RxJsonRpcMessage<RoleServer>>(value.clone()) {
        Ok(message) => Line::Message(Box::new(message)),
        // A notification is never answered.
        Err(_) if id.is_none() && value.get("method").is_some_and(Value::is_string) => Line::Skip,
        Err(e) => Line::Reply(error(
            id.unwrap_or(Value::Null),
            INVALID_REQUEST,
            &format!("Invalid Request: {e}"),
        )),
    }
}

/// The `id` of a line that does not parse, when the rest of it does once each lone surrogate
/// escape is read as U+FFFD (and any bytes that are not UTF-8 too): `null` otherwise, or when
/// the id is not one a reply may carry.
fn readable_id(line: &[u8]) -> Value {
    let text = String::from_utf8_lossy(line);
    let mended = mend_surrogates(&text);
    serde_json::from_str::<Value>(&mended)
        .ok()
        .and_then(|v| v.get("id").cloned())
        .filter(|id| id.is_i64() || id.is_u64() || id.is_string())
        .unwrap_or(Value::Null)
}

/// `text` with every `\uXXXX` escape of a UTF-16 surrogate that is not half of a pair replaced
/// by `\ufffd`.
fn mend_surrogates(text: &str) -> String {
    let unit = |s: &str, at: usize| -> Option<u16> {
        let hex = s.get(at..at + 6)?.strip_prefix("\\u")?;
        u16::from_str_radix(hex, 16).ok()
    };
    let is_high = |u: u16| (0xD800..0xDC00).contains(&u);
    let is_low = |u: u16| (0xDC00..0xE000).contains(&u);
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i..].starts_with("\\\\") {
            out.push_str("\\\\");
            i += 2;
            continue;
        }
        match unit(text, i) {
            Some(u) if is_high(u) && unit(text, i + 6).is_some_and(is_low) => {
                out.push_str(&text[i..i + 12]);
                i += 12;
            }
            Some(u) if is_high(u) || is_low(u) => {
                out.push_str("\\ufffd");
                i += 6;
            }
            _ => {
                let c = text[i..].chars().next().unwrap_or('\u{fffd}');
                out.push(c);
                i += c.len_utf8().max(1);
            }
        }
    }
    out
}

/// A JSON-RPC error reply.
fn error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

/// Writes `line` and a newline, whole, and flushes.
async fn write_line<W: AsyncWrite + Unpin>(
    write: &Mutex<W>,
    mut line: Vec<u8>,
) -> std::io::Result<()> {
    line.push(b'\n');
    let mut write = write.lock().await;
    write.write_all(&line).await?;
    write.flush().await
}

impl<R, W> Transport<RoleServer> for LineTransport<R, W>
where
    R: tokio::io::AsyncRead + Unpin + Send,
    W: AsyncWrite + Unpin + Send + 'static,
{
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleServer>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        let write = Arc::clone(&self.write);
        async move {
            let line = serde_json::to_vec(&item)?;
            write_line(&write, line).await
        }
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleServer>> {
        loop {
            match self.next_line().await? {
                Ok(()) => {}
                Err(_) => return None,
            }
            let line = if std::mem::take(&mut self.oversized) {
                Line::Reply(error(
                    Value::Null,
                    PARSE_ERROR,
                    &format!("Parse error: a message longer than {MAX_LINE} bytes"),
                ))
            } else {
                classify(&self.line)
            };
            self.line.clear();
            match line {
                Line::Message(message) => return Some(*message),
                Line::Skip => {}
                Line::Reply(reply) => {
                    let bytes = reply.to_string().into_bytes();
                    if write_line(&self.write, bytes).await.is_err() {
                        return None;
                    }
                }
            }
        }
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.write.lock().await.flush().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(line: &str) -> Value {
        match classify(line.as_bytes()) {
            Line::Reply(reply) => reply,
            other => panic!("{line}: {other:?}"),
        }
    }

    #[test]
    fn each_kind_of_bad_line_gets_the_error_json_rpc_names() {
        let parse = reply("{\"jsonrpc\": \"2.0\", \"id\": 3, \"method\"");
        assert_eq!(parse["error"]["code"], PARSE_ERROR);
        assert_eq!(parse["id"], Value::Null);
        let surrogate = reply(
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"analyze","arguments":{"path":"a\ud800b"}}}"#,
        );
        assert_eq!(surrogate["error"]["code"], PARSE_ERROR);
        assert_eq!(surrogate["id"], 7, "the id is still read");
        for id in ["1.5", "{}", "[1]", "true"] {
            let bad = reply(&format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/list"}}"#
            ));
            assert_eq!(bad["error"]["code"], INVALID_REQUEST, "id {id}");
            assert_eq!(bad["id"], Value::Null, "id {id}");
        }
        let no_method = reply(r#"{"jsonrpc":"2.0","id":"x"}"#);
        assert_eq!(no_method["error"]["code"], INVALID_REQUEST);
        assert_eq!(no_method["id"], "x");
        assert_eq!(reply("[]")["error"]["code"], INVALID_REQUEST);
        assert_eq!(reply("\"hi\"")["error"]["code"], INVALID_REQUEST);
        match classify(b"\xff{}") {
            Line::Reply(r) => assert_eq!(r["error"]["code"], PARSE_ERROR),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn good_lines_pass_and_unknown_notifications_are_dropped() {
        let list = classify(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
        assert!(matches!(list, Line::Message(_)), "{list:?}");
        let note = classify(br#"{"jsonrpc":"2.0","method":"$/odd","params":5}"#);
        assert!(matches!(note, Line::Skip), "{note:?}");
        assert!(matches!(classify(b"  \r"), Line::Skip));
    }

    #[test]
    fn only_lone_surrogates_are_mended() {
        assert_eq!(mend_surrogates(r#""\ud83d\ude00""#), r#""\ud83d\ude00""#);
        assert_eq!(mend_surrogates(r#""\ude00\ud83d""#), r#""\ufffd\ufffd""#);
        assert_eq!(mend_surrogates(r#""\\ud800""#), r#""\\ud800""#);
        assert_eq!(mend_surrogates("é\\uD800x"), "é\\ufffdx");
    }
}
