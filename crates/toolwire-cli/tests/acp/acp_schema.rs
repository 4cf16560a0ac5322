//! ACP's JSON schema check for the Rust ACP tests: a tee between the agent's
//! stdio and the client connection that validates every line the agent
//! writes before the client sees it, each method's params, result or error
//! against its own definition (found by the definitions' `x-method` and
//! `x-side`, as the Python suite's `support.py` does).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, DuplexStream};

/// The committed schema the Python suite checks against too.
const SCHEMA: &str = include_str!("../acp_python/schema/acp-v1-schema-1.21.0-unstable.json");

/// The parsed schema, its definitions by (x-side, x-method, kind), and the
/// validators compiled so far.
struct Schema {
    root: Value,
    by_method: HashMap<(String, String, &'static str), String>,
    validators: Mutex<HashMap<String, Arc<jsonschema::Validator>>>,
}

fn schema() -> &'static Schema {
    static SCHEMA_CELL: OnceLock<Schema> = OnceLock::new();
    SCHEMA_CELL.get_or_init(|| {
        let root: Value = serde_json::from_str(SCHEMA).expect("the committed schema is JSON");
        let mut by_method = HashMap::new();
        for (name, def) in root["$defs"].as_object().expect("$defs") {
            let (Some(method), Some(side)) = (def["x-method"].as_str(), def["x-side"].as_str())
            else {
                continue;
            };
            for kind in ["Request", "Response", "Notification"] {
                if name.ends_with(kind) {
                    by_method.insert((side.to_owned(), method.to_owned(), kind), name.clone());
                }
            }
        }
        Schema {
            root,
            by_method,
            validators: Mutex::default(),
        }
    })
}

impl Schema {
    fn name(&self, side: &str, method: &str, kind: &'static str) -> Option<&String> {
        self.by_method
            .get(&(side.to_owned(), method.to_owned(), kind))
            .or_else(|| {
                self.by_method
                    .get(&("protocol".to_owned(), method.to_owned(), kind))
            })
    }

    fn validator(&self, name: &str) -> Arc<jsonschema::Validator> {
        let mut cache = self.validators.lock().expect("validator cache");
        cache
            .entry(name.to_owned())
            .or_insert_with(|| {
                let schema = serde_json::json!({
                    "$schema": self.root["$schema"],
                    "$defs": self.root["$defs"],
                    "$ref": format!("#/$defs/{name}"),
                });
                Arc::new(
                    jsonschema::validator_for(&schema)
                        .unwrap_or_else(|e| panic!("the schema's {name} compiles: {e}")),
                )
            })
            .clone()
    }

    /// What `name` finds wrong with `value`, one line per error.
    fn errors(&self, name: &str, value: &Value) -> Vec<String> {
        self.validator(name)
            .iter_errors(value)
            .map(|e| {
                let at = e.instance_path().to_string();
                let at = if at.is_empty() {
                    "(top)".to_owned()
                } else {
                    at
                };
                format!("{name} at {at}: {e}")
            })
            .collect()
    }
}

/// What the tee found: the agent's invalid messages, and the client's
/// requests still waiting for the agent's response (id → method).
#[derive(Clone, Default)]
pub struct WireCheck {
    problems: Arc<Mutex<Vec<String>>>,
    pending: Arc<Mutex<HashMap<String, String>>>,
    /// How many lines the agent wrote.
    checked: Arc<std::sync::atomic::AtomicU64>,
    /// Each `session/update` the agent wrote: its kind, the bytes of its
    /// line and of its `update` object.
    updates: Arc<Mutex<Vec<UpdateSize>>>,
    /// Each request the agent sent: its method and the bytes of its line.
    requests: Arc<Mutex<Vec<(String, usize)>>>,
    /// Every message the agent wrote, in the order it wrote them (what a
    /// client's polling may reorder; the order checks read this).
    messages: Arc<Mutex<Vec<Value>>>,
}

/// The size of one `session/update` on the wire.
#[derive(Debug, Clone)]
pub struct UpdateSize {
    /// `tool_call`, `tool_call_update`, `agent_message_chunk`…
    pub kind: String,
    /// The whole line, newline included.
    pub line_bytes: usize,
    /// The `update` object alone (as the agent serialized it).
    pub update_bytes: usize,
}

impl WireCheck {
    /// Every problem found so far, each naming the method and the schema
    /// error, with the offending line.
    pub fn problems(&self) -> Vec<String> {
        self.problems.lock().expect("problems").clone()
    }

    /// How many lines of the agent were checked.
    pub fn checked(&self) -> u64 {
        self.checked.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The `session/update`s the agent wrote so far, in order.
    pub fn updates(&self) -> Vec<UpdateSize> {
        self.updates.lock().expect("updates").clone()
    }

    /// The requests the agent sent so far (method, line bytes), in order.
    pub fn requests(&self) -> Vec<(String, usize)> {
        self.requests.lock().expect("requests").clone()
    }

    /// Every message the agent wrote so far, in wire order.
    pub fn messages(&self) -> Vec<Value> {
        self.messages.lock().expect("messages").clone()
    }

    /// Panics listing every message the agent wrote that the schema rejects.
    pub fn assert_valid(&self) {
        let problems = self.problems();
        assert!(
            problems.is_empty(),
            "the agent sent messages that ACP's schema rejects:\n{}",
            problems.join("\n")
        );
    }

    /// Records a line the client sent: its requests await the agent's answer.
    pub fn client_line(&self, line: &[u8]) {
        let Ok(msg) = serde_json::from_slice::<Value>(line) else {
            return;
        };
        if let (Some(method), Some(id)) = (msg["method"].as_str(), msg.get("id")) {
            self.pending
                .lock()
                .expect("pending")
                .insert(id.to_string(), method.to_owned());
        }
    }

    /// Checks a line the agent wrote.
    pub fn agent_line(&self, line: &[u8]) {
        self.checked
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let text = String::from_utf8_lossy(line);
        let text = text.trim_end();
        if text.is_empty() {
            return;
        }
        let (method, problems) = match serde_json::from_str::<Value>(text) {
            Ok(msg) => {
                if let (Some(method), Some(_)) = (msg["method"].as_str(), msg.get("id")) {
                    self.requests
                        .lock()
                        .expect("requests")
                        .push((method.to_owned(), line.len()));
                }
                if msg["method"] == "session/update" {
                    let update = &msg["params"]["update"];
                    self.updates.lock().expect("updates").push(UpdateSize {
                        kind: update["sessionUpdate"].as_str().unwrap_or("").to_owned(),
                        line_bytes: line.len(),
                        update_bytes: update.to_string().len(),
                    });
                }
                let checked = self.agent_problems(&msg);
                self.messages.lock().expect("messages").push(msg);
                checked
            }
            Err(e) => ("(none)".to_owned(), vec![format!("not JSON: {e}")]),
        };
        if problems.is_empty() {
            return;
        }
        let shown: String = if text.len() > 600 {
            format!(
                "{}... ({} bytes)",
                &text[..text.floor_char_boundary(600)],
                text.len()
            )
        } else {
            text.to_owned()
        };
        let report = format!(
            "agent sent {method} that ACP's schema rejects: {shown}\n{}",
            problems
                .iter()
                .map(|p| format!("  - {p}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        eprintln!("{report}");
        self.problems.lock().expect("problems").push(report);
    }

    /// The method the message is about, and what is wrong with it.
    fn agent_problems(&self, msg: &Value) -> (String, Vec<String>) {
        let schema = schema();
        let Some(obj) = msg.as_object() else {
            return (
                "(none)".to_owned(),
                vec!["not a JSON object (batches are not used by ACP)".to_owned()],
            );
        };
        let mut problems = Vec::new();
        if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            problems.push(format!(
                "\"jsonrpc\" is {:?}, not \"2.0\"",
                obj.get("jsonrpc")
            ));
        }
        if let Some(method) = obj.get("method") {
            let Some(method) = method.as_str() else {
                problems.push(format!("method {method} is not a string"));
                return ("(none)".to_owned(), problems);
            };
            let kind = if obj.contains_key("id") {
                if !matches!(obj["id"], Value::Number(_) | Value::String(_)) {
                    problems.push(format!(
                        "request id {} is not a number or string",
                        obj["id"]
                    ));
                }
                "Request"
            } else {
                "Notification"
            };
            // Handled by the client, or by either side.
            let Some(name) = schema.name("client", method, kind) else {
                if !method.starts_with('_') {
                    problems.push(format!(
                        "{method} is no {} that the client handles in ACP v1",
                        kind.to_lowercase()
                    ));
                }
                return (method.to_owned(), problems);
            };
            match obj.get("params") {
                Some(params) => problems.extend(schema.errors(name, params)),
                None => problems.push("no params".to_owned()),
            }
            return (method.to_owned(), problems);
        }
        let Some(id) = obj.get("id") else {
            problems.push("neither a request, a response nor a notification".to_owned());
            return ("(none)".to_owned(), problems);
        };
        let Some(method) = self
            .pending
            .lock()
            .expect("pending")
            .remove(&id.to_string())
        else {
            problems.push(format!(
                "a response to id {id}, which the client never sent (or was answered)"
            ));
            return ("(a response)".to_owned(), problems);
        };
        let what = format!("the response to {method}");
        match (obj.get("result"), obj.get("error")) {
            (Some(_), Some(_)) | (None, None) => {
                problems.push("needs exactly one of result and error".to_owned());
            }
            (None, Some(error)) => problems.extend(schema.errors("Error", error)),
            (Some(result), None) => match schema.name("agent", &method, "Response") {
                Some(name) => problems.extend(schema.errors(name, result)),
                None if method.starts_with('_') => {}
                None => problems.push(format!("no response type for {method}")),
            },
        }
        (what, problems)
    }
}

/// Room in each pipe between the tee and the client.
const PIPE: usize = 1 << 20;

/// Puts the check between the agent (`to_agent`, `from_agent`) and the
/// client: returns the client's ends (what it writes, what it reads). Every
/// line the agent writes is checked before the client reads it; when the
/// client closes its end, the agent's stdin is closed.
pub fn tee<W, R>(to_agent: W, from_agent: R) -> (DuplexStream, DuplexStream, WireCheck)
where
    W: AsyncWrite + Unpin + Send + 'static,
    R: AsyncRead + Unpin + Send + 'static,
{
    let check = WireCheck::default();
    let (client_out, mut tee_in) = tokio::io::duplex(PIPE);
    let (mut tee_out, client_in) = tokio::io::duplex(PIPE);

    let requests = check.clone();
    tokio::spawn(async move {
        let mut to_agent = to_agent;
        let mut lines = BufReader::new(&mut tee_in);
        let mut line = Vec::new();
        loop {
            line.clear();
            match lines.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            // Recorded before the agent can answer it.
            requests.client_line(&line);
            if to_agent.write_all(&line).await.is_err() || to_agent.flush().await.is_err() {
                break;
            }
        }
        // The client closed: so does the agent's stdin.
        let _ = to_agent.shutdown().await;
    });

    let checker = check.clone();
    tokio::spawn(async move {
        let mut lines = BufReader::new(from_agent);
        let mut line = Vec::new();
        let mut client_gone = false;
        loop {
            line.clear();
            match lines.read_until(b'\n', &mut line).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            checker.agent_line(&line);
            // Checked before the client sees it; after the client is gone
            // the agent's lines are still checked.
            if !client_gone && tee_out.write_all(&line).await.is_err() {
                client_gone = true;
            }
        }
        let _ = tee_out.shutdown().await;
    });

    (client_out, client_in, check)
}

/// The check itself, on lines written by hand: what the committed schema
/// allows passes, and each thing it does not is reported by method.
#[test]
fn the_check_refuses_what_the_schema_refuses() {
    let check = WireCheck::default();
    check.client_line(br#"{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{}}"#);
    let good = [
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","status":"completed"}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"result":{"stopReason":"end_turn"}}"#,
    ];
    for line in good {
        check.agent_line(line.as_bytes());
    }
    assert_eq!(check.problems(), Vec::<String>::new());
    let bad = [
        // No such status.
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call_update","toolCallId":"c","status":"done"}}}"#,
        // A tool call without its id.
        r#"{"jsonrpc":"2.0","method":"session/update","params":{"sessionId":"s","update":{"sessionUpdate":"tool_call","title":"Read"}}}"#,
        // A method the client does not handle.
        r#"{"jsonrpc":"2.0","method":"session/teleport","params":{}}"#,
    ];
    for line in bad {
        check.agent_line(line.as_bytes());
    }
    let problems = check.problems();
    assert_eq!(problems.len(), 3, "{problems:#?}");
    assert!(problems[0].contains("session/update"), "{}", problems[0]);
    assert!(problems[2].contains("session/teleport"), "{}", problems[2]);
    assert_eq!(check.checked(), 5);
}
