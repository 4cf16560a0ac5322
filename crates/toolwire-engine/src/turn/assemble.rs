//! Message assembly: what a model step has produced so far and the
//! message it becomes, tool results, interjections as user messages, and
//! the notifications a message carries.

use std::time::Duration;

use serde_json::Value;
use toolwire_core::notification::USER_SOURCE;
use toolwire_core::{
    AgentEvent, Batch, ContentBlock, ConversationId, GatedCall, Incoming, Message, MessageId,
    MessageStatus, Priority, Role, ToolCall, ToolCallId, Usage,
};
use toolwire_providers::ToolFormat;
use toolwire_stream::{StreamEvent, XmlToolCallParser};
use toolwire_tools::{ToolError, ToolOutput};

use super::{Stop, Turn};
use crate::config::EngineConfig;
use crate::notify::{InjectionMode, NOTIFICATION_TOOL};

/// A user message of `text` under `parent`.
pub(crate) fn user_message(conversation: ConversationId, parent: MessageId, text: &str) -> Message {
    Message::new(
        conversation,
        Some(parent),
        Role::User,
        vec![ContentBlock::Text {
            text: text.to_owned(),
        }],
    )
}

impl Turn<'_> {
    /// Stores one result as a tool message under the newest node.
    pub(super) async fn store_result(
        &mut self,
        call_id: &ToolCallId,
        result: Result<ToolOutput, ToolError>,
        took: Duration,
        reminder: Option<String>,
    ) -> Result<(), Stop> {
        let (mut content, is_error, error, images) = match result {
            Ok(out) => (out.content, out.is_error, None, out.images),
            Err(e) => {
                let text = format!("Error: {e}");
                (text.clone(), true, Some(e.to_string()), Vec::new())
            }
        };
        // Each image is stored once, by hash, before the result that
        // refers to it: a result never names bytes the store lacks.
        let mut refs = Vec::with_capacity(images.len());
        for image in images {
            match self
                .cx
                .store
                .put_blob(image.media_type(), image.bytes())
                .await
            {
                Ok(r) => refs.push(r),
                Err(e) => {
                    tracing::warn!(call = %call_id.0, error = %e, "a tool's image could not be stored");
                    content.push_str(&format!(
                        "\n[image: {}, {} bytes: not kept, the store failed: {e}]",
                        image.media_type(),
                        image.bytes().len()
                    ));
                }
            }
        }
        if let Some(reminder) = reminder {
            // Reminder-mode interjections travel as notifications.
            self.cx.notifications.push(
                &self.cx.config.notifications.queue,
                self.conversation,
                Incoming::text(USER_SOURCE, Priority::High, reminder),
            );
        }
        let mut message = Message::new(
            self.conversation,
            Some(self.leaf),
            Role::Tool,
            vec![ContentBlock::ToolResult {
                tool_use_id: call_id.clone(),
                content,
                is_error,
                images: refs,
            }],
        );
        message.duration_ms = Some(took.as_millis() as u64);
        if is_error {
            message.status = MessageStatus::Error;
        }
        let (injected, batch) = if self.cx.config.notifications.mode == InjectionMode::Augment {
            self.take_notifications(&mut message).unzip()
        } else {
            (None, None)
        };
        let (run_id, call_id, stored) = (self.run_id, call_id.clone(), message.clone());
        let event = match error {
            Some(error) => AgentEvent::ToolExecutionFailed {
                run_id,
                call_id,
                error,
                message: stored,
            },
            None => AgentEvent::ToolExecutionCompleted {
                run_id,
                call_id,
                message: stored,
            },
        };
        let mut events = vec![event];
        events.extend(injected);
        self.store_carrying(&message, events, batch).await?;
        self.on_path(&message);
        Ok(())
    }

    /// Drains the conversation's notifications onto `message` (as
    /// notification blocks); returns the event that announces them and the
    /// batch, to put back if `message` cannot be stored.
    pub(super) fn take_notifications(&self, message: &mut Message) -> Option<(AgentEvent, Batch)> {
        if !self.cx.config.notifications.enabled {
            return None;
        }
        let batch = self.cx.notifications.drain(self.conversation)?;
        message.content.extend(batch.blocks());
        Some((self.injected(message.id, &batch), batch))
    }

    /// The event that announces `batch` on message `message_id`.
    pub(super) fn injected(&self, message_id: MessageId, batch: &Batch) -> AgentEvent {
        AgentEvent::NotificationsInjected {
            run_id: self.run_id,
            message_id,
            notices: batch.notices.clone(),
            text: batch.format(),
        }
    }

    /// Stores `message` with `events`; the notifications `batch` it
    /// carries are then delivered. If storing fails, they wait again for
    /// the next message: taken from the queue is not delivered until
    /// stored.
    pub(super) async fn store_carrying(
        &self,
        message: &Message,
        events: Vec<AgentEvent>,
        batch: Option<Batch>,
    ) -> Result<(), Stop> {
        let stored = self.cx.bus.store_message(message, events).await;
        self.settle(batch, stored)
    }

    /// The notifications `batch` a message carried are delivered if it
    /// was `stored`, else put back for the next message.
    pub(super) fn settle(
        &self,
        batch: Option<Batch>,
        stored: Result<(), toolwire_store::StoreError>,
    ) -> Result<(), Stop> {
        if let Some(batch) = batch {
            match stored {
                Ok(()) => self.cx.notifications.delivered(self.conversation, &batch),
                Err(_) => self.put_back(batch),
            }
        }
        Ok(stored?)
    }

    /// Puts back notifications taken for a message that was not stored.
    pub(super) fn put_back(&self, batch: Batch) {
        let queue = &self.cx.config.notifications.queue;
        self.cx
            .notifications
            .restore(queue, self.conversation, batch);
    }

    /// In [`InjectionMode::SyntheticTool`], what waits after the step's
    /// results: a `_system_notification` call and its result.
    pub(super) async fn inject_synthetic(&mut self) -> Result<(), Stop> {
        let settings = &self.cx.config.notifications;
        if !settings.enabled || settings.mode != InjectionMode::SyntheticTool {
            return Ok(());
        }
        let Some(batch) = self.cx.notifications.drain(self.conversation) else {
            return Ok(());
        };
        let call_id = ToolCallId(format!("notification_{}", MessageId::new().0.simple()));
        let call = Message::new(
            self.conversation,
            Some(self.leaf),
            Role::Assistant,
            vec![ContentBlock::ToolUse {
                id: call_id.clone(),
                server: None,
                name: NOTIFICATION_TOOL.into(),
                arguments: serde_json::json!({}),
            }],
        );
        // The call does not carry them yet: its result does.
        if let Err(e) = self.cx.bus.store_message(&call, Vec::new()).await {
            self.put_back(batch);
            return Err(e.into());
        }
        self.extend_path(&call);
        let mut content = vec![ContentBlock::ToolResult {
            tool_use_id: call_id,
            content: String::new(),
            is_error: false,
            images: Vec::new(),
        }];
        content.extend(batch.blocks());
        let result = Message::new(self.conversation, Some(call.id), Role::Tool, content);
        let event = self.injected(result.id, &batch);
        self.store_carrying(&result, vec![event], Some(batch))
            .await?;
        self.on_path(&result);
        Ok(())
    }
}

/// What one model call has produced so far.
pub(super) struct StepState {
    xml: Option<XmlToolCallParser>,
    reasoning: String,
    text: String,
    /// Calls in the order they started.
    calls: Vec<StepCall>,
    pub(super) usage: Option<Usage>,
    /// Bytes of text, reasoning and arguments admitted so far.
    output_bytes: usize,
    /// Stream events admitted so far.
    events: usize,
}

/// One call of the step, as far as the stream has told it.
struct StepCall {
    id: ToolCallId,
    name: String,
    /// Argument text received, kept for a call that never became ready.
    raw_arguments: String,
    /// Set when the provider closed the call with valid arguments.
    arguments: Option<Value>,
    /// Set when the call cannot be run.
    failure: Option<String>,
}

impl StepCall {
    fn new(id: &str, name: String) -> Self {
        StepCall {
            id: ToolCallId(id.to_owned()),
            name,
            raw_arguments: String::new(),
            arguments: None,
            failure: None,
        }
    }
}

impl StepState {
    pub(super) fn new(format: ToolFormat) -> Self {
        StepState {
            xml: (format == ToolFormat::Xml).then(XmlToolCallParser::new),
            reasoning: String::new(),
            text: String::new(),
            calls: Vec::new(),
            usage: None,
            output_bytes: 0,
            events: 0,
        }
    }

    /// Counts `event` against the step's caps; an event that would go
    /// over one is refused (not recorded), so that what the step holds and
    /// stores stays under `max_step_output_bytes`.
    pub(super) fn admit(
        &mut self,
        event: &StreamEvent,
        config: &EngineConfig,
    ) -> Result<(), String> {
        let bytes = match event {
            StreamEvent::TextDelta { text } | StreamEvent::ReasoningDelta { text } => text.len(),
            StreamEvent::ArgumentsDelta { fragment, .. } => fragment.len(),
            _ => 0,
        };
        if self.output_bytes + bytes > config.max_step_output_bytes {
            return Err(format!(
                "the model's output went over {} bytes in one step (max_step_output_bytes); cut",
                config.max_step_output_bytes
            ));
        }
        if self.events >= config.max_step_events {
            return Err(format!(
                "the model's stream went over {} events in one step (max_step_events); cut",
                config.max_step_events
            ));
        }
        self.output_bytes += bytes;
        self.events += 1;
        Ok(())
    }

    /// Records `event`; returns the events to publish (with the XML
    /// format, text is parsed for calls first).
    pub(super) fn accept(&mut self, event: StreamEvent) -> Vec<StreamEvent> {
        let events = match (&mut self.xml, event) {
            (Some(parser), StreamEvent::TextDelta { text }) => parser.feed(&text),
            (_, other) => vec![other],
        };
        for e in &events {
            self.record(e);
        }
        events
    }

    pub(super) fn finish(&mut self) -> Vec<StreamEvent> {
        let events = self
            .xml
            .as_mut()
            .map(XmlToolCallParser::finish)
            .unwrap_or_default();
        for e in &events {
            self.record(e);
        }
        events
    }

    fn call(&mut self, id: &str) -> Option<&mut StepCall> {
        self.calls.iter_mut().find(|c| c.id.0 == id)
    }

    fn record(&mut self, event: &StreamEvent) {
        match event {
            StreamEvent::TextDelta { text } => self.text.push_str(text),
            StreamEvent::ReasoningDelta { text } => self.reasoning.push_str(text),
            StreamEvent::ToolCallStarted { call_id, name, .. } => {
                self.calls.push(StepCall::new(call_id, name.clone()));
            }
            StreamEvent::ArgumentsDelta { call_id, fragment } => {
                if let Some(c) = self.call(call_id) {
                    c.raw_arguments.push_str(fragment);
                }
            }
            StreamEvent::ToolCallReady {
                call_id, arguments, ..
            } => {
                if let Some(c) = self.call(call_id) {
                    c.arguments = Some(arguments.clone());
                }
            }
            StreamEvent::ToolCallFailed { call_id, reason } => match self.call(call_id) {
                Some(c) => c.failure = Some(reason.clone()),
                None => {
                    let mut c = StepCall::new(call_id, String::new());
                    c.failure = Some(reason.clone());
                    self.calls.push(c);
                }
            },
            StreamEvent::Usage(u) => {
                self.usage = Some(Usage {
                    prompt_tokens: u.prompt_tokens,
                    completion_tokens: u.completion_tokens,
                    cached_tokens: u.cached_tokens,
                    cache_write_tokens: u.cache_write_tokens,
                });
            }
            _ => {}
        }
    }

    /// The message content: reasoning, text, then the tool calls (only
    /// when the step completed: a broken step's calls are not run).
    pub(super) fn content(&self, complete: bool) -> Vec<ContentBlock> {
        let mut content = Vec::new();
        if !self.reasoning.is_empty() {
            content.push(ContentBlock::Reasoning {
                text: self.reasoning.clone(),
            });
        }
        if !self.text.is_empty() {
            content.push(ContentBlock::Text {
                text: self.text.clone(),
            });
        }
        if complete {
            for c in &self.calls {
                content.push(ContentBlock::ToolUse {
                    id: c.id.clone(),
                    server: None,
                    name: c.name.clone(),
                    arguments: c
                        .arguments
                        .clone()
                        .unwrap_or_else(|| Value::String(c.raw_arguments.clone())),
                });
            }
        }
        content
    }

    pub(super) fn calls(&self) -> Vec<GatedCall> {
        self.calls
            .iter()
            .map(|c| GatedCall {
                call: ToolCall {
                    id: c.id.clone(),
                    server: None,
                    name: c.name.clone(),
                    arguments: c.arguments.clone().unwrap_or(Value::Null),
                },
                gate: None,
                invalid: match (&c.arguments, &c.failure) {
                    (_, Some(reason)) => Some(reason.clone()),
                    (None, None) => Some("the call was never completed".into()),
                    (Some(_), None) => None,
                },
            })
            .collect()
    }
}
