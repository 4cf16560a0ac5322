//! Slash commands (ACP `available_commands_update`): a prompt whose text
//! starts with `/NAME` of a command here runs the command instead of
//! going to the model as it is. The table is the built-in commands
//! ([`BUILTINS`]: `/compact`, `/fork`, `/model`; one entry and one arm
//! each) and each
//! connected MCP server's prompts, as `/mcp__SERVER__PROMPT`: those are
//! filled in by the server (`prompts/get`) and the result goes to the
//! model as the prompt. A `/word` that names no command is an ordinary
//! prompt (a path, say).

use std::collections::BTreeMap;
use std::sync::Arc;

use agent_client_protocol::Client;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AvailableCommand, AvailableCommandInput, AvailableCommandsUpdate, ConfigOptionUpdate,
    ContentBlock, ContentChunk, PromptResponse, SessionId, SessionNotification, SessionUpdate,
    StopReason, UnstructuredCommandInput,
};
use toolwire_tools::mcp::{McpPrompt, McpServer};

use crate::errors::{internal, invalid_params};
use crate::state::Session;
use crate::{AcpAgent, config};

/// A built-in command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Builtin {
    Compact,
    Fork,
    Model,
}

/// The built-in commands: name, description (short: every session is
/// told them), input hint.
const BUILTINS: &[(Builtin, &str, &str, Option<&str>)] = &[
    (Builtin::Compact, "compact", "Summarise older turns", None),
    (Builtin::Fork, "fork", "Fork this session", None),
    (Builtin::Model, "model", "Switch the model", Some("name")),
];

/// The prefix of an MCP prompt's command name.
const MCP_PREFIX: &str = "mcp__";

/// The command name of `prompt` of MCP server `server`.
fn prompt_command(server: &str, prompt: &str) -> String {
    format!("{MCP_PREFIX}{server}__{prompt}")
}

/// The session's MCP prompts, by command name (a server that cannot list
/// them is logged and left out).
async fn mcp_prompts(session: &Session) -> BTreeMap<String, (Arc<McpServer>, McpPrompt)> {
    let mut prompts = BTreeMap::new();
    for server in session.mcp.iter() {
        match server.prompts().await {
            Ok(listed) => {
                for prompt in listed {
                    prompts.insert(
                        prompt_command(server.name(), &prompt.name),
                        (server.clone(), prompt),
                    );
                }
            }
            Err(e) => tracing::warn!(server = server.name(), error = %e, "MCP prompts left out"),
        }
    }
    prompts
}

/// The commands the session offers.
pub(crate) async fn available(session: &Session) -> Vec<AvailableCommand> {
    let mut commands: Vec<AvailableCommand> = BUILTINS
        .iter()
        .map(|(_, name, description, hint)| {
            let command = AvailableCommand::new(*name, *description);
            match hint {
                Some(hint) => command.input(AvailableCommandInput::Unstructured(
                    UnstructuredCommandInput::new(*hint),
                )),
                None => command,
            }
        })
        .collect();
    for (name, (server, prompt)) in mcp_prompts(session).await {
        let description = prompt.description.clone().unwrap_or_else(|| {
            format!("Prompt `{}` of MCP server `{}`", prompt.name, server.name())
        });
        let mut command = AvailableCommand::new(name, description);
        if !prompt.arguments.is_empty() {
            let hint = prompt
                .arguments
                .iter()
                .map(|a| {
                    if a.required {
                        format!("{}=…", a.name)
                    } else {
                        format!("[{}=…]", a.name)
                    }
                })
                .collect::<Vec<_>>()
                .join(" ");
            command = command.input(AvailableCommandInput::Unstructured(
                UnstructuredCommandInput::new(hint),
            ));
        }
        commands.push(command);
    }
    commands
}

/// Sends the session's commands (after the response that opened it).
pub(crate) async fn send_available(
    cx: &ConnectionTo<Client>,
    id: &SessionId,
    session: &Session,
) -> Result<(), agent_client_protocol::Error> {
    let commands = available(session).await;
    cx.send_notification(SessionNotification::new(
        id.clone(),
        SessionUpdate::AvailableCommandsUpdate(AvailableCommandsUpdate::new(commands)),
    ))
}

/// What a prompt's text turned out to be.
pub(crate) enum Outcome {
    /// Not a command, or a command that makes the prompt (MCP prompts):
    /// this text goes to the model.
    Prompt(String),
    /// A command that answered the prompt itself.
    Answered(PromptResponse),
}

/// `/NAME REST` split, when the text starts with a slash.
fn split(text: &str) -> Option<(&str, &str)> {
    let rest = text.trim_start().strip_prefix('/')?;
    let (name, args) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    Some((name, args.trim()))
}

/// The arguments of an MCP prompt from the text after its command:
/// `key=value` words, or else the whole text as the prompt's one (or
/// first required) argument.
fn prompt_arguments(prompt: &McpPrompt, text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut arguments = BTreeMap::new();
    if text.is_empty() {
    } else if text.split_whitespace().all(|w| w.contains('=')) {
        for word in text.split_whitespace() {
            if let Some((key, value)) = word.split_once('=') {
                if !prompt.arguments.iter().any(|a| a.name == key) {
                    return Err(format!(
                        "prompt `{}` has no argument `{key}`; it takes: {}",
                        prompt.name,
                        argument_names(prompt)
                    ));
                }
                arguments.insert(key.to_owned(), value.to_owned());
            }
        }
    } else {
        let Some(first) = prompt
            .arguments
            .iter()
            .find(|a| a.required)
            .or(prompt.arguments.first())
        else {
            return Err(format!("prompt `{}` takes no arguments", prompt.name));
        };
        arguments.insert(first.name.clone(), text.to_owned());
    }
    let missing: Vec<_> = prompt
        .arguments
        .iter()
        .filter(|a| a.required && !arguments.contains_key(&a.name))
        .map(|a| a.name.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "prompt `{}` needs {} (as name=value)",
            prompt.name,
            missing.join(", ")
        ));
    }
    Ok(arguments)
}

fn argument_names(prompt: &McpPrompt) -> String {
    if prompt.arguments.is_empty() {
        return "nothing".into();
    }
    prompt
        .arguments
        .iter()
        .map(|a| a.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Says `text` to the editor as the agent.
fn say(
    cx: &ConnectionTo<Client>,
    id: &SessionId,
    text: String,
) -> Result<(), agent_client_protocol::Error> {
    cx.send_notification(SessionNotification::new(
        id.clone(),
        SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::from(text))),
    ))
}

impl AcpAgent {
    /// Runs the command `text` names, if it names one.
    pub(crate) async fn run_command(
        &self,
        session: &Session,
        id: &SessionId,
        text: String,
        cx: &ConnectionTo<Client>,
    ) -> Result<Outcome, agent_client_protocol::Error> {
        let Some((name, rest)) = split(&text) else {
            return Ok(Outcome::Prompt(text));
        };
        let builtin = BUILTINS.iter().find(|b| b.1 == name).map(|b| b.0);
        let answered = Ok(Outcome::Answered(PromptResponse::new(StopReason::EndTurn)));
        match builtin {
            Some(Builtin::Compact) => {
                // The session's turn options: its model's window, and
                // `[context] summary_model` if set, write the summary.
                let handle = self
                    .engine
                    .compact(session.conversation, session.turn_options())
                    .await
                    .map_err(|e| invalid_params(format!("/compact: {e}")))?;
                let outcome = handle.wait().await;
                let compacted = outcome.final_message.as_ref().and_then(|m| {
                    m.content.iter().find_map(|b| match b {
                        toolwire_core::ContentBlock::Compaction {
                            covered,
                            tokens_before,
                            tokens_after,
                            ..
                        } => Some((*covered, *tokens_before, *tokens_after)),
                        _ => None,
                    })
                });
                let Some((covered, before, after)) = compacted else {
                    return Err(invalid_params(format!(
                        "/compact: {}",
                        outcome
                            .error
                            .unwrap_or_else(|| format!("stopped: {:?}", outcome.reason))
                    )));
                };
                tracing::info!(session = %id.0, covered, before, after, "ACP /compact");
                say(
                    cx,
                    id,
                    format!(
                        "Compacted: {covered} earlier messages are now sent as a summary \
                         (about {before} → {after} tokens). They stay stored; a fork from \
                         before them still sends them."
                    ),
                )?;
                answered
            }
            Some(Builtin::Fork) => {
                let mcp_servers = session.mcp_servers.to_vec();
                let (forked, _) = self
                    .fork(id, &session.cwd, &session.additional, &mcp_servers, cx)
                    .await?;
                tracing::info!(session = %id.0, fork = %forked.0, "ACP /fork");
                say(
                    cx,
                    id,
                    format!(
                        "Forked this session into `{}`: open it from the history to go on \
                         from here there.",
                        forked.0
                    ),
                )?;
                answered
            }
            Some(Builtin::Model) if rest.is_empty() => {
                let current = session
                    .model()
                    .unwrap_or_else(|| self.engine.models().default_entry().info.name.clone());
                say(
                    cx,
                    id,
                    format!(
                        "Model: {current}. The models: {}.",
                        self.engine.models().names()
                    ),
                )?;
                answered
            }
            Some(Builtin::Model) => {
                config::set_model(&self.engine, session, rest).await?;
                cx.send_notification(SessionNotification::new(
                    id.clone(),
                    SessionUpdate::ConfigOptionUpdate(ConfigOptionUpdate::new(config::options(
                        &self.engine,
                        session,
                    ))),
                ))?;
                say(cx, id, format!("Model: {rest}."))?;
                answered
            }
            None if name.starts_with(MCP_PREFIX) => {
                let mut prompts = mcp_prompts(session).await;
                let Some((server, prompt)) = prompts.remove(name) else {
                    return Err(invalid_params(format!(
                        "unknown command `/{name}`: no connected MCP server offers that prompt"
                    )));
                };
                let arguments = prompt_arguments(&prompt, rest).map_err(invalid_params)?;
                let messages = server
                    .prompt(&prompt.name, arguments)
                    .await
                    .map_err(internal)?;
                let text = messages
                    .into_iter()
                    .map(|m| m.text)
                    .collect::<Vec<_>>()
                    .join("\n\n");
                if text.is_empty() {
                    return Err(internal(format!(
                        "MCP prompt `{}` of `{}` gave no text",
                        prompt.name,
                        server.name()
                    )));
                }
                Ok(Outcome::Prompt(text))
            }
            None => Ok(Outcome::Prompt(text)),
        }
    }
}

#[cfg(test)]
mod tests {
    use toolwire_tools::mcp::McpPromptArgument;

    use super::*;

    fn prompt(args: &[(&str, bool)]) -> McpPrompt {
        McpPrompt {
            name: "p".into(),
            description: None,
            arguments: args
                .iter()
                .map(|(n, r)| McpPromptArgument {
                    name: (*n).into(),
                    description: None,
                    required: *r,
                })
                .collect(),
        }
    }

    #[test]
    fn a_command_is_a_leading_slash_word() {
        assert_eq!(split("/model gpt"), Some(("model", "gpt")));
        assert_eq!(split("  /fork"), Some(("fork", "")));
        assert_eq!(split("no /model"), None);
    }

    #[test]
    fn prompt_arguments_by_name_or_whole() {
        let p = prompt(&[("city", true), ("units", false)]);
        let by_name = prompt_arguments(&p, "city=Oslo units=C").unwrap();
        assert_eq!(by_name["city"], "Oslo");
        assert_eq!(by_name["units"], "C");
        let whole = prompt_arguments(&p, "New York").unwrap();
        assert_eq!(whole["city"], "New York");
        let missing = prompt_arguments(&p, "").unwrap_err();
        assert!(missing.contains("city"), "{missing}");
        let unknown = prompt_arguments(&p, "town=x").unwrap_err();
        assert!(unknown.contains("`town`"), "{unknown}");
        assert!(prompt_arguments(&prompt(&[]), "").unwrap().is_empty());
    }
}
