//! An MCP server's prompts (`prompts/list`, `prompts/get`), for front doors
//! that offer them to people (ACP slash commands). A server that does not
//! say it has prompts is not asked.

use std::collections::BTreeMap;

use rmcp::model::GetPromptRequestParams;
use serde_json::Value;

use super::{McpError, McpServer, service_error};

/// Time a `prompts/*` request may take.
const PROMPT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// One prompt a server offers.
#[derive(Debug, Clone, PartialEq)]
pub struct McpPrompt {
    pub name: String,
    pub description: Option<String>,
    pub arguments: Vec<McpPromptArgument>,
}

/// One argument of a prompt.
#[derive(Debug, Clone, PartialEq)]
pub struct McpPromptArgument {
    pub name: String,
    pub description: Option<String>,
    pub required: bool,
}

/// One message of a prompt as the server filled it in: its role
/// (`user` or `assistant`) and its text (other content is left out).
#[derive(Debug, Clone, PartialEq)]
pub struct McpPromptMessage {
    pub role: String,
    pub text: String,
}

impl McpServer {
    /// Its prompts (all pages); none when it does not offer prompts.
    pub async fn prompts(&self) -> Result<Vec<McpPrompt>, McpError> {
        let connection = self.connection().await?;
        let offers = connection
            .client
            .peer_info()
            .is_some_and(|info| info.capabilities.prompts.is_some());
        if !offers {
            return Ok(Vec::new());
        }
        let listed =
            tokio::time::timeout(PROMPT_TIMEOUT, connection.client.peer().list_all_prompts())
                .await
                .map_err(|_| self.prompt_error("prompts/list", "no answer in time".into()))?
                .map_err(|e| self.prompt_error("prompts/list", service_error(&e)))?;
        Ok(listed
            .into_iter()
            .map(|p| McpPrompt {
                name: p.name,
                description: p.description,
                arguments: p
                    .arguments
                    .unwrap_or_default()
                    .into_iter()
                    .map(|a| McpPromptArgument {
                        name: a.name,
                        description: a.description,
                        required: a.required.unwrap_or(false),
                    })
                    .collect(),
            })
            .collect())
    }

    /// Prompt `name` filled in with `arguments`: its messages.
    pub async fn prompt(
        &self,
        name: &str,
        arguments: BTreeMap<String, String>,
    ) -> Result<Vec<McpPromptMessage>, McpError> {
        let connection = self.connection().await?;
        let mut params = GetPromptRequestParams::new(name);
        if !arguments.is_empty() {
            params = params.with_arguments(
                arguments
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect(),
            );
        }
        let result = tokio::time::timeout(PROMPT_TIMEOUT, connection.client.get_prompt(params))
            .await
            .map_err(|_| self.prompt_error("prompts/get", "no answer in time".into()))?
            .map_err(|e| self.prompt_error("prompts/get", service_error(&e)))?;
        Ok(result
            .messages
            .into_iter()
            .filter_map(|m| {
                let text = m.content.as_text()?.text.clone();
                let role = match m.role {
                    rmcp::model::Role::Assistant => "assistant",
                    _ => "user",
                };
                Some(McpPromptMessage {
                    role: role.to_owned(),
                    text,
                })
            })
            .collect())
    }

    fn prompt_error(&self, request: &str, detail: String) -> McpError {
        McpError::Prompt {
            server: self.name().to_owned(),
            request: request.to_owned(),
            detail,
        }
    }
}
