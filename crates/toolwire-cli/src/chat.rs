//! `toolwire chat`: an interactive terminal client on the engine.
//!
//! Lines are read on a thread (stdin blocks) and sent to the loop, which
//! also follows the conversation's events and Ctrl-C. A line typed while a
//! turn runs is an interjection. Slash commands move around the tree.

use std::io::BufRead;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use tokio::sync::mpsc;
use toolwire_core::{ConversationId, Message, MessageId, Role};
use toolwire_engine::{Engine, Interjection};

use crate::config::EngineArgs;
use crate::render::Renderer;

#[derive(Debug, Args)]
pub struct ChatArgs {
    #[command(flatten)]
    engine: EngineArgs,
}

const HELP: &str = "\
Commands:
  /branches            list the conversation's branches (leaves)
  /switch N            continue from branch N of /branches
  /edit TEXT           replace your last message with TEXT and answer again
  /regenerate          answer your last message again (a new sibling)
  /fork                copy this branch into a new conversation
  /new                 start a new conversation
  /open ID             continue conversation ID
  /conversations       list conversations
  /help                this help
  /quit                leave (also Ctrl-D)
A line typed while the agent works reaches it after the running tool.
Ctrl-C cancels the running turn.";

pub async fn run(args: &ChatArgs) -> Result<ExitCode> {
    let settings = args.engine.resolve()?;
    // Kept to the end: the file watcher runs as long as `running`.
    let running = settings.start().await?;
    let engine = running.engine.clone();
    let conversation = engine.create_conversation(None).await?.id;
    eprintln!(
        "toolwire chat · model {} · {} tools · conversation {conversation}\n\
         Type a message; /help for commands; Ctrl-C cancels a turn, Ctrl-D quits.",
        engine.models().default_entry().info.name,
        engine.tools().specs().len(),
    );
    let mut chat = Chat {
        follower: engine.follow(conversation),
        engine,
        renderer: Renderer::new(),
    };
    let mut lines = read_lines();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            line = lines.recv() => match line {
                Some(line) => {
                    if !chat.line(line.trim()).await? {
                        break;
                    }
                }
                None => break,
            },
            batch = chat.follower.next() => match batch? {
                Some(events) => {
                    for e in events {
                        chat.renderer.render(&e.event)?;
                    }
                }
                None => break,
            },
            _ = tokio::signal::ctrl_c() => {
                if chat.engine.cancel(chat.conversation()) {
                    eprintln!("\n(cancelling the turn…)");
                } else {
                    break;
                }
            }
            _ = tick.tick(), if chat.renderer.spinning() => chat.renderer.tick(),
        }
    }
    // Leave no turn half-done behind us.
    chat.engine.cancel(chat.conversation());
    running.stop().await;
    Ok(ExitCode::SUCCESS)
}

/// Standard input, line by line, from a thread.
fn read_lines() -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel(16);
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.blocking_send(line).is_err() {
                break;
            }
        }
    });
    rx
}

struct Chat {
    engine: Engine,
    follower: toolwire_engine::Follower,
    renderer: Renderer,
}

impl Chat {
    fn conversation(&self) -> ConversationId {
        self.follower.conversation()
    }

    fn open(&mut self, conversation: ConversationId) {
        self.follower = self.engine.follow(conversation);
        eprintln!("(conversation {conversation})");
    }

    /// Handles one typed line; `false` to leave.
    async fn line(&mut self, line: &str) -> Result<bool> {
        if line.is_empty() {
            return Ok(true);
        }
        if let Some(command) = line.strip_prefix('/') {
            let (name, rest) = command.split_once(' ').unwrap_or((command, ""));
            if let Err(e) = self.command(name, rest.trim()).await {
                eprintln!("{e:#}");
            }
            return Ok(name != "quit" && name != "exit");
        }
        let conversation = self.conversation();
        if self.engine.is_running(conversation) {
            if let Interjection::Queued = self.engine.interject(conversation, line).await? {
                eprintln!("(noted: the agent sees this after the running tool)");
            }
        } else {
            self.engine.send(conversation, line, None).await?;
        }
        Ok(true)
    }

    /// Whether no turn runs in `conversation`, waiting a little for one
    /// that is ending: a command typed as soon as the answer shows would
    /// otherwise meet the turn still storing its last step.
    async fn settled(&self, conversation: ConversationId) -> bool {
        const ENDING: Duration = Duration::from_secs(3);
        let deadline = tokio::time::Instant::now() + ENDING;
        while self.engine.is_running(conversation) {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }

    async fn command(&mut self, name: &str, rest: &str) -> Result<()> {
        let conversation = self.conversation();
        let engine = self.engine.clone();
        let store = engine.store();
        if matches!(name, "switch" | "edit" | "regenerate") && !self.settled(conversation).await {
            bail!("a turn is running; wait for it or press Ctrl-C first");
        }
        match name {
            "help" | "?" => eprintln!("{HELP}"),
            "quit" | "exit" => {}
            "branches" => {
                let active = store.conversation(conversation).await?.active_leaf;
                let leaves = store.leaves(conversation).await?;
                for (i, leaf) in leaves.iter().enumerate() {
                    let mark = if leaf.id == active { "*" } else { " " };
                    eprintln!(
                        "{mark} {}. [{}] {}",
                        i + 1,
                        leaf.role.as_str(),
                        leaf.summary(70)
                    );
                }
            }
            "switch" => {
                let n: usize = rest.parse().context("usage: /switch N (see /branches)")?;
                let leaves = store.leaves(conversation).await?;
                let leaf = leaves.get(n.wrapping_sub(1)).with_context(|| {
                    format!("there is no branch {n}; /branches lists {}", leaves.len())
                })?;
                self.engine.set_active_leaf(conversation, leaf.id).await?;
                eprintln!("(on branch {n}: {})", leaf.summary(70));
            }
            "edit" => {
                if rest.is_empty() {
                    bail!("usage: /edit NEW TEXT");
                }
                let user = self.last_on_path(Role::User).await?;
                self.engine.edit(user, rest).await?;
            }
            "regenerate" => {
                let assistant = self.last_on_path(Role::Assistant).await?;
                self.engine.regenerate(assistant).await?;
            }
            "fork" => {
                let leaf = store.conversation(conversation).await?.active_leaf;
                let fork = self.engine.fork(leaf).await?;
                self.open(fork.id);
            }
            "new" => {
                let c = self.engine.create_conversation(None).await?;
                self.open(c.id);
            }
            "open" => {
                let id: ConversationId = rest.parse()?;
                store.conversation(id).await?;
                self.open(id);
            }
            "conversations" => {
                for c in store.list_conversations().await?.iter().take(20) {
                    eprintln!(
                        "{} · {} messages · ${:.4}",
                        c.conversation.id, c.message_count, c.total_cost
                    );
                }
            }
            other => bail!("unknown command /{other}; /help lists them"),
        }
        Ok(())
    }

    /// The newest message of `role` on the active path.
    async fn last_on_path(&self, role: Role) -> Result<MessageId> {
        let store = self.engine.store();
        let leaf = store.conversation(self.conversation()).await?.active_leaf;
        let path: Vec<Message> = store.path_to(leaf).await?;
        path.iter()
            .rev()
            .find(|m| m.role == role)
            .map(|m| m.id)
            .with_context(|| format!("there is no {} message yet", role.as_str()))
    }
}
