//! `toolwire exec`: one turn without a UI. The answer streams to stdout and
//! tool activity to stderr; with `--json`, every event is a JSON line.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use toolwire_core::{AgentEvent, ContentBlock, ConversationId, StopReason};
use toolwire_engine::TurnOptions;
use toolwire_store::StoredEvent;

use crate::config::EngineArgs;
use crate::render::Renderer;

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Print every event as one JSON object per line on stdout.
    #[arg(long)]
    json: bool,
    /// Continue this conversation (from its active leaf) instead of a new one.
    #[arg(long, value_name = "ID")]
    conversation: Option<ConversationId>,
    /// Attach an image (PNG, JPEG, GIF or WebP, up to 5 MiB) to the
    /// prompt; repeat for several. A model without vision reads a
    /// placeholder naming each.
    #[arg(long, value_name = "FILE")]
    image: Vec<PathBuf>,
    #[command(flatten)]
    engine: EngineArgs,
    /// What to ask.
    prompt: String,
}

pub async fn run(args: &ExecArgs) -> Result<ExitCode> {
    // Kept to the end: the file watcher runs as long as `running`.
    let running = args.engine.resolve()?.start().await?;
    let engine = running.engine.clone();
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
    // Follow before the turn starts, so that nothing is missed.
    let mut follower = engine.follow(conversation);
    let handle = if args.image.is_empty() {
        engine.send(conversation, &args.prompt, None).await?
    } else {
        let mut content = vec![ContentBlock::Text {
            text: args.prompt.clone(),
        }];
        for path in &args.image {
            let bytes = std::fs::read(path)
                .with_context(|| format!("--image {}: reading it", path.display()))?;
            let image = engine
                .put_image(&bytes, None)
                .await
                .with_context(|| format!("--image {}", path.display()))?;
            content.push(ContentBlock::Image(image));
        }
        engine
            .send_content_with(conversation, content, None, TurnOptions::default())
            .await?
    };
    let run_id = handle.run_id;
    let mut renderer = Renderer::new();
    'events: while let Some(batch) = follower.next().await? {
        for event in batch {
            if args.json {
                print_json(&event)?;
            } else {
                renderer.render(&event.event)?;
            }
            if matches!(&event.event, AgentEvent::Stopped { run_id: r, .. } if *r == run_id) {
                break 'events;
            }
        }
    }
    let outcome = handle.wait().await;
    running.stop().await;
    if !args.json {
        eprintln!("conversation {conversation}");
    }
    Ok(match outcome.reason {
        StopReason::EndTurn => ExitCode::SUCCESS,
        _ => ExitCode::FAILURE,
    })
}

fn print_json(stored: &StoredEvent) -> Result<()> {
    let mut value = serde_json::to_value(&stored.event)?;
    if let Some(obj) = value.as_object_mut() {
        obj.insert("seq".into(), stored.seq.into());
    }
    let mut out = std::io::stdout().lock();
    serde_json::to_writer(&mut out, &value)?;
    out.write_all(b"\n")?;
    Ok(out.flush()?)
}
