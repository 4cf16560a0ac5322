//! `toolwire exec`: one turn without a UI. The answer streams to stdout and
//! tool activity to stderr; with `--json`, every event is a JSON line.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use tokio::sync::broadcast::error::RecvError;
use toolwire_core::{AgentEvent, ConversationId, StopReason};
use toolwire_store::StoredEvent;

use crate::config::EngineArgs;

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Print every event as one JSON object per line on stdout.
    #[arg(long)]
    json: bool,
    /// Continue this conversation (from its active leaf) instead of a new one.
    #[arg(long, value_name = "ID")]
    conversation: Option<ConversationId>,
    #[command(flatten)]
    engine: EngineArgs,
    /// What to ask.
    prompt: String,
}

pub async fn run(args: &ExecArgs) -> Result<ExitCode> {
    let engine = args.engine.resolve()?.engine().await?;
    let conversation = match args.conversation {
        Some(id) => {
            engine
                .store()
                .conversation(id)
                .await
                .context("--conversation")?
                .id
        }
        None => engine.create_conversation(None).await?.id,
    };
    // Subscribe before the turn starts, so that nothing is missed.
    let mut events = engine.subscribe(conversation);
    let handle = engine.send(conversation, &args.prompt, None).await?;
    let run_id = handle.run_id;
    let mut printer = Printer {
        json: args.json,
        last_seq: 0,
        mid_line: false,
    };
    loop {
        let event = match events.recv().await {
            Ok(event) => event,
            Err(RecvError::Lagged(_)) => {
                // Fell behind: what was missed is in the store.
                for e in engine
                    .events_since(conversation, printer.last_seq, u32::MAX)
                    .await?
                {
                    printer.print(&e)?;
                }
                continue;
            }
            Err(RecvError::Closed) => break,
        };
        if event.seq <= printer.last_seq {
            continue;
        }
        printer.print(&event)?;
        if matches!(&event.event, AgentEvent::Stopped { run_id: r, .. } if *r == run_id) {
            break;
        }
    }
    let outcome = handle.wait().await;
    if !args.json {
        eprintln!("conversation {conversation}");
    }
    Ok(match outcome.reason {
        StopReason::EndTurn => ExitCode::SUCCESS,
        reason => {
            if !args.json {
                eprintln!(
                    "toolwire: the turn stopped ({}){}",
                    reason.as_str(),
                    outcome.error.map(|e| format!(": {e}")).unwrap_or_default()
                );
            }
            ExitCode::FAILURE
        }
    })
}

struct Printer {
    json: bool,
    last_seq: u64,
    /// Text has been printed since the last line break.
    mid_line: bool,
}

impl Printer {
    fn print(&mut self, stored: &StoredEvent) -> Result<()> {
        self.last_seq = stored.seq;
        if self.json {
            let mut value = serde_json::to_value(&stored.event)?;
            if let Some(obj) = value.as_object_mut() {
                obj.insert("seq".into(), stored.seq.into());
            }
            let mut out = std::io::stdout().lock();
            serde_json::to_writer(&mut out, &value)?;
            out.write_all(b"\n")?;
            return Ok(out.flush()?);
        }
        match &stored.event {
            AgentEvent::TextDelta { text, .. } => {
                let mut out = std::io::stdout().lock();
                out.write_all(text.as_bytes())?;
                out.flush()?;
                self.mid_line = !text.ends_with('\n');
            }
            AgentEvent::AssistantMessageCreated { .. } if self.mid_line => {
                // Each model message on its own lines.
                println!();
                self.mid_line = false;
            }
            AgentEvent::ToolCallStarted { name, .. } => eprintln!("\n→ {name}…"),
            AgentEvent::ArgumentField { key, value, .. }
                if value.is_string() || value.is_number() =>
            {
                let shown = value.to_string();
                if shown.len() <= 120 {
                    eprintln!("  {key}: {shown}");
                }
            }
            AgentEvent::ToolExecutionCompleted { message, .. } => {
                eprintln!("  ✓ done in {} ms", message.duration_ms.unwrap_or(0));
            }
            AgentEvent::ToolExecutionFailed { error, .. } => eprintln!("  ✗ {error}"),
            _ => {}
        }
        Ok(())
    }
}
