//! Agent events for people at a terminal: the answer on stdout as it
//! streams; tool activity on stderr (the name the moment it is known, then
//! argument fields, progress and the outcome).

use std::io::{IsTerminal, Write};
use std::time::Instant;

use toolwire_core::{AgentEvent, Progress};

/// Writes one line to stderr in a single call: stderr is unbuffered, and a
/// formatted line written piece by piece can be torn by other output.
macro_rules! say {
    ($($arg:tt)*) => {{
        let mut line = format!($($arg)*);
        line.push('\n');
        say_raw!("{line}");
    }};
}

/// [`say!`] without the line end (the spinner redraws its line).
macro_rules! say_raw {
    ($($arg:tt)*) => {{
        let text = format!($($arg)*);
        let _ = std::io::stderr().lock().write_all(text.as_bytes());
    }};
}

const SPINNER: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

pub struct Renderer {
    /// Text has been printed since the last line break.
    mid_line: bool,
    /// A tool is running: (name, started); animated on a terminal.
    running: Option<(String, Instant)>,
    frame: usize,
    animate: bool,
}

impl Renderer {
    pub fn new() -> Self {
        Renderer {
            mid_line: false,
            running: None,
            frame: 0,
            animate: std::io::stderr().is_terminal(),
        }
    }

    pub fn spinning(&self) -> bool {
        self.animate && self.running.is_some()
    }

    /// Advances the spinner of the running tool.
    pub fn tick(&mut self) {
        if let (true, Some((name, started))) = (self.animate, &self.running) {
            self.frame = (self.frame + 1) % SPINNER.len();
            say_raw!(
                "\r{} Running {name}… {:.1}s\x1b[K",
                SPINNER[self.frame],
                started.elapsed().as_secs_f32()
            );
        }
    }

    fn clear_spinner(&self) {
        if self.spinning() {
            say_raw!("\r\x1b[K");
        }
    }

    fn line_break(&mut self) {
        if self.mid_line {
            println!();
            self.mid_line = false;
        }
    }

    pub fn render(&mut self, event: &AgentEvent) -> std::io::Result<()> {
        match event {
            AgentEvent::TextDelta { text, .. } => {
                self.clear_spinner();
                let mut out = std::io::stdout().lock();
                out.write_all(text.as_bytes())?;
                out.flush()?;
                self.mid_line = !text.ends_with('\n');
            }
            AgentEvent::AssistantMessageCreated { .. } => self.line_break(),
            AgentEvent::ModelFallback {
                from, to, reason, ..
            } => {
                self.line_break();
                say!("(model {from} {}; {to} answers)", reason.replace('_', " "));
            }
            AgentEvent::ToolCallStarted { name, .. } => {
                self.line_break();
                say!("→ Calling {name}…");
            }
            AgentEvent::ArgumentField { key, value, .. } => {
                let shown = match value {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                if shown.len() <= 120 && !shown.contains('\n') {
                    say!("  {key}: {shown}");
                }
            }
            AgentEvent::ToolExecutionStarted { name, .. } => {
                self.running = Some((name.clone(), Instant::now()));
            }
            AgentEvent::ToolExecutionProgress {
                progress: Progress::Status { text },
                ..
            } => {
                self.clear_spinner();
                say!("  … {text}");
            }
            AgentEvent::ToolExecutionCompleted { message, .. } => {
                self.clear_spinner();
                self.running = None;
                say!("  ✓ done in {} ms", message.duration_ms.unwrap_or(0));
                // The result's text is the model's; its images are named.
                for image in message.images() {
                    say!("    {}", image.mention());
                }
            }
            AgentEvent::ToolExecutionFailed { error, .. } => {
                self.clear_spinner();
                self.running = None;
                say!("  ✗ {error}");
            }
            AgentEvent::NotificationsInjected { notices, .. } => {
                self.clear_spinner();
                self.line_break();
                for n in notices {
                    say!("  ⟡ [{}] {}", n.source, n.text);
                }
            }
            AgentEvent::ApprovalRequested { calls, .. } => {
                self.line_break();
                for c in calls.iter().filter(|c| c.gate.is_some()) {
                    say!("  ⏸ {} waits for approval", c.call.name);
                }
            }
            AgentEvent::UserInterjection { message, .. } => {
                self.line_break();
                say!("» you (during the turn): {}", message.text());
            }
            AgentEvent::Stopped { reason, error, .. } => {
                self.clear_spinner();
                self.running = None;
                self.line_break();
                if let Some(error) = error {
                    say!("(stopped: {}: {error})", reason.as_str());
                }
            }
            _ => {}
        }
        Ok(())
    }
}
