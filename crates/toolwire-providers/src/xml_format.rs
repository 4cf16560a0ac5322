//! The XML text protocol for models without native tool calling: tools
//! described in the system prompt, past calls and results written as text
//! that `toolwire-stream` parses back.

use std::fmt::Write;
use std::sync::Arc;

use toolwire_core::{ContentBlock, Message, Role};

use crate::history::{Group, grouped};

use toolwire_core::ToolSpec;

/// The system prompt addition that teaches the XML tool format.
pub fn tools_prompt(tools: &[Arc<ToolSpec>]) -> String {
    let mut s = String::from(
        "You can call tools. To call one, write exactly:\n\
         <tool_call>\n  <tool_name>NAME</tool_name>\n  \
         <arguments><![CDATA[{\"arg\": \"value\"}]]></arguments>\n</tool_call>\n\
         Arguments are a JSON object. You may make several calls in one message. \
         After your calls, stop and wait: the results come back in <tool_result> \
         blocks. Do not put tool calls inside code blocks.\n\nTools:\n",
    );
    for t in tools {
        let _ = writeln!(
            s,
            "- {}: {}\n  parameters: {}",
            t.name, t.description, t.parameters
        );
    }
    s
}

/// The path rewritten for the XML protocol: tool calls become XML text in
/// the assistant's message and results become user messages.
pub fn as_text_protocol(path: &[Message]) -> Vec<Message> {
    let mut out = Vec::with_capacity(path.len());
    for group in grouped(path) {
        match group {
            Group::Message(m) if m.role == Role::Assistant => {
                let mut text = m.text();
                for (_, server, name, args) in m.tool_uses() {
                    text.push_str("\n<tool_call>\n");
                    if let Some(server) = server {
                        let _ = writeln!(text, "  <server_name>{server}</server_name>");
                    }
                    let _ = write!(
                        text,
                        "  <tool_name>{name}</tool_name>\n  <arguments><![CDATA[{}]]></arguments>\n</tool_call>",
                        args.to_string().replace("]]>", "]]]]><![CDATA[>")
                    );
                }
                let mut copy = m.clone();
                copy.content = vec![ContentBlock::Text { text }];
                out.push(copy);
            }
            Group::Message(m) => out.push(m.clone()),
            Group::Results(results) => {
                let mut text = String::new();
                let mut images = Vec::new();
                for answer in results {
                    let (id, content, is_error) = (answer.id, answer.content, answer.is_error);
                    let _ = writeln!(
                        text,
                        "<tool_result call_id=\"{id}\" error=\"{is_error}\">\n{content}\n</tool_result>"
                    );
                    // The text protocol has no place for an image in a
                    // result: it follows the results, in the same message.
                    images.extend(answer.images.iter().cloned().map(ContentBlock::Image));
                }
                let mut content = vec![ContentBlock::Text { text }];
                content.extend(images);
                out.push(Message::new(
                    path[0].conversation_id,
                    None,
                    Role::User,
                    content,
                ));
            }
        }
    }
    out
}
