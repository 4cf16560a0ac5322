//! The model step: one model call, streamed out as it comes, and the
//! assistant message it becomes.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use futures::{FutureExt, StreamExt};
use toolwire_core::notification::SYSTEM_PROMPT_ADDITION;
use toolwire_core::{
    AgentEvent, GatedCall, Message, MessageId, MessageStatus, Role, StopReason, ToolCallId,
};
use toolwire_providers::{
    EventStream, ModelEntry, ModelRequest, RequestImages, ToolFormat, xml_format,
};
use toolwire_stream::StreamEvent;
use toolwire_tools::ToolSpec;

use super::assemble::StepState;
use super::{Stop, Turn};
use crate::notify::{InjectionMode, NOTIFICATION_TOOL};

impl<'a> Turn<'a> {
    /// One model call: streams its events out (each batch that the
    /// provider has ready is stored in one transaction), then stores the
    /// message with what it leads to: its tool calls, or the final answer.
    /// Returns the message and its calls; the turn's path ends with the
    /// message once it is stored.
    pub(super) async fn model_step(
        &mut self,
        iteration: u32,
    ) -> Result<(Message, Vec<GatedCall>), Stop> {
        // The turn's own path when it has it: read from the store only
        // at the turn's first step (and not even then when the last turn
        // left it), or after a change the turn did not make itself.
        let mut path = self.take_path().await?;
        if self.turn_index.is_none() {
            self.turn_index = Some(
                path.iter()
                    .filter(|m| m.role == Role::User)
                    .count()
                    .saturating_sub(1),
            );
        }
        // Named now, so that clients can tie the streamed pieces (and a
        // fallback) to the message they become; announced with the first
        // batch (no write of its own).
        let message_id = MessageId::new();
        let stored_root = self
            .options
            .system_prompt
            .is_some()
            .then(|| path.first().cloned())
            .flatten();
        self.render_system_prompt(&mut path).await;
        // What the request sends: within the model's window (`fit.rs`).
        let sent = self.fit(&mut path, iteration).await?;
        // The turn's path stays as stored; the tools see what the model saw.
        self.seen_root = match (stored_root, path.first_mut()) {
            (Some(stored), Some(first)) => Some(std::mem::replace(first, stored)),
            _ => None,
        };
        let images = self.images(&sent).await?;
        let started = Instant::now();
        let (stream, answering) = tokio::select! {
            s = self.open_stream(sent, iteration, message_id, &images) => s?,
            _ = self.cancel.cancelled() => return Err(self.cancelled()),
        };
        let mut step = StepState::new(self.tool_format(answering));
        let mut failure: Option<Stop> = None;
        let mut step_started = Some(AgentEvent::StepStarted {
            run_id: self.run_id,
            message_id,
            iteration,
        });
        let mut batches = stream.ready_chunks(256);
        // The events of the stream's last batch, when the stream had
        // already ended once that batch was read (a model that answered at
        // once): stored with the step's message, in its transaction, rather
        // than in one of their own. Still stored before they are published.
        let mut held: Vec<AgentEvent> = Vec::new();
        // A batch that was ready when the stream's end was looked for.
        let mut ready = None;
        while failure.is_none() {
            let batch = match ready.take() {
                Some(batch) => Some(batch),
                None => tokio::select! {
                    batch = batches.next() => batch,
                    _ = self.cancel.cancelled() => {
                        failure = Some(self.cancelled());
                        break;
                    }
                },
            };
            let Some(batch) = batch else { break };
            let mut publish: Vec<AgentEvent> = step_started.take().into_iter().collect();
            for item in batch {
                match item {
                    Ok(event) => {
                        if let Err(over) = step.admit(&event, self.cx.config) {
                            failure = Some(Stop::new(StopReason::LlmApiError, over));
                            break;
                        }
                        for e in step.accept(event) {
                            match self.translate(e) {
                                Ok(Some(agent_event)) => publish.push(agent_event),
                                Ok(None) => {}
                                Err(stop) => failure = failure.or(Some(stop)),
                            }
                        }
                    }
                    Err(e) => {
                        failure =
                            failure.or(Some(Stop::new(StopReason::LlmApiError, e.to_string())))
                    }
                }
                if failure.is_some() {
                    break;
                }
            }
            if failure.is_none() && !self.cancel.is_cancelled() {
                match batches.next().now_or_never() {
                    Some(None) => {
                        held = publish;
                        break;
                    }
                    Some(Some(batch)) => ready = Some(batch),
                    None => {}
                }
            }
            self.cx.bus.emit_all(self.conversation, publish).await?;
        }
        if failure.is_none() {
            // Stored with the message below (the step's last events and
            // its message in one transaction), published after it.
            held.extend(step_started.take());
            held.extend(
                step.finish()
                    .into_iter()
                    .filter_map(|e| self.translate(e).ok().flatten()),
            );
        }
        let model = &answering.info;
        let mut message = Message::new(
            self.conversation,
            Some(self.leaf),
            Role::Assistant,
            step.content(failure.is_none()),
        );
        message.id = message_id;
        message.model = Some(model.name.clone());
        message.duration_ms = Some(started.elapsed().as_millis() as u64);
        if let Some(usage) = step.usage {
            message.usage = Some(usage);
            message.cost = match &model.price {
                Some(price) => Some(price.cost(&usage)),
                None => self.cx.config.prices.cost(&model.model, &usage),
            };
            self.usage += usage;
            if let Some(c) = message.cost {
                self.cost = Some(self.cost.unwrap_or(0.0) + c);
            }
        }
        if failure.is_some() {
            // Keep what was received; its calls are not run.
            message.status = MessageStatus::Interrupted;
        }
        let calls: Vec<GatedCall> = if failure.is_none() {
            step.calls()
                .into_iter()
                .map(|mut c| {
                    c.gate = c
                        .invalid
                        .is_none()
                        .then(|| self.gate(&c.call.name))
                        .flatten();
                    c
                })
                .collect()
        } else {
            Vec::new()
        };
        if !message.content.is_empty() || failure.is_none() {
            let run_id = self.run_id;
            let mut events = std::mem::take(&mut held);
            events.push(AgentEvent::AssistantMessageCreated {
                run_id,
                message: message.clone(),
            });
            if failure.is_none() {
                events.push(if calls.is_empty() {
                    AgentEvent::FinalResponse {
                        run_id,
                        message_id: message.id,
                        usage: self.usage,
                        cost: self.cost,
                    }
                } else if calls.iter().any(|c| c.gate.is_some()) {
                    AgentEvent::ApprovalRequested {
                        run_id,
                        message_id: message.id,
                        calls: calls.clone(),
                    }
                } else {
                    AgentEvent::ToolCallsGenerated {
                        run_id,
                        message_id: message.id,
                        calls: calls.iter().map(|c| c.call.clone()).collect(),
                    }
                });
            }
            if failure.is_none() && calls.is_empty() {
                // The turn's last step: stored with the run's end, in
                // its transaction (see `turn::run`), published after it.
                self.closing = Some((message.clone(), events));
            } else {
                self.cx.bus.store_message(&message, events).await?;
            }
            self.leaf = message.id;
            path.push(super::as_stored(&message));
        }
        self.give_path(path);
        if let Some(stop) = failure {
            return Err(stop);
        }
        Ok((message, calls))
    }

    /// The call's stream from the turn's model; when that model is busy
    /// or out of reach (its provider's retries spent, nothing received),
    /// from the next model of its `fallback` list, each tried once and
    /// announced by a stored [`AgentEvent::ModelFallback`]. Returns the
    /// model that answers. The next step asks the turn's model again.
    async fn open_stream(
        &self,
        path: Vec<Message>,
        iteration: u32,
        message_id: MessageId,
        images: &HashMap<String, Arc<[u8]>>,
    ) -> Result<(EventStream, &'a ModelEntry), Stop> {
        let mut model: &'a ModelEntry = self.model;
        let mut fallbacks = self.model.info.fallback.iter();
        // The path moves into the request of the last model that may be
        // asked: a copy of every message of a long conversation is what a
        // step would otherwise cost most.
        let mut path = Some(path);
        loop {
            let messages = if fallbacks.clone().next().is_some() {
                path.clone()
            } else {
                path.take()
            };
            let mut request = self.request(model, messages.unwrap_or_default(), iteration);
            let vision = model.info.capabilities.vision;
            request.images = RequestImages {
                vision,
                bytes: if vision {
                    images.clone()
                } else {
                    HashMap::new()
                },
            };
            let error = match model.provider.stream(&request).await {
                Ok(stream) => return Ok((stream, model)),
                Err(e) => e,
            };
            let next = if error.is_overload_or_unavailable() {
                fallbacks.find_map(|name| self.cx.models.get(name))
            } else {
                None
            };
            let Some(next) = next else {
                return Err(Stop::new(StopReason::LlmApiError, error.to_string()));
            };
            tracing::warn!(
                from = %model.info.name,
                to = %next.info.name,
                reason = error.kind(),
                error = %error,
                "model unavailable; its fallback answers the step"
            );
            let event = AgentEvent::ModelFallback {
                run_id: self.run_id,
                message_id,
                from: model.info.name.clone(),
                to: next.info.name.clone(),
                reason: error.kind().to_owned(),
                error: error.to_string(),
            };
            self.cx.bus.emit_all(self.conversation, vec![event]).await?;
            model = next;
        }
    }

    /// Replaces the text of the path's root (the stored system prompt) by
    /// what the turn's [`SystemPrompt`](super::SystemPrompt) renders from
    /// it, for this step's request only.
    async fn render_system_prompt(&self, path: &mut [Message]) {
        let Some(hook) = self.options.system_prompt.clone() else {
            return;
        };
        let Some(root) = path.first_mut().filter(|m| m.role == Role::System) else {
            return;
        };
        match hook.render(&root.text()).await {
            Ok(rendered) => {
                root.content = vec![toolwire_core::ContentBlock::Text { text: rendered }]
            }
            Err(error) => tracing::warn!(
                conversation = %self.conversation,
                %error,
                "the system prompt's addition failed; the stored prompt is sent"
            ),
        }
    }

    /// How `model` writes tool calls: XML when the deployment or the
    /// model lacks native tool calling.
    fn tool_format(&self, model: &ModelEntry) -> ToolFormat {
        if self.cx.config.tool_format == ToolFormat::Xml || !model.info.capabilities.tools {
            ToolFormat::Xml
        } else {
            ToolFormat::Native
        }
    }

    /// `model`'s request of `path` (its root becomes the system prompt):
    /// the path moves into it, not copied.
    pub(super) fn request(
        &self,
        model: &ModelEntry,
        mut path: Vec<Message>,
        iteration: u32,
    ) -> ModelRequest {
        let mut system = path.first().map(Message::text).unwrap_or_default();
        if !path.is_empty() {
            path.remove(0);
        }
        let rest = path;
        let mut tools = self.specs();
        let notifications = &self.cx.config.notifications;
        if notifications.enabled {
            if !system.is_empty() {
                system.push_str("\n\n");
            }
            system.push_str(SYSTEM_PROMPT_ADDITION);
            if notifications.mode == InjectionMode::SyntheticTool {
                tools.push(Arc::new(ToolSpec {
                    name: NOTIFICATION_TOOL.into(),
                    server: None,
                    description: "Delivers notifications to you. Never call this tool yourself: \
                                  toolwire calls it when something happens while you work."
                        .into(),
                    parameters: serde_json::json!({"type": "object", "properties": {}}),
                    read_only: true,
                }));
            }
        }
        match self.tool_format(model) {
            ToolFormat::Native => ModelRequest {
                system,
                messages: rest,
                tools,
                turn: self.turn_index.unwrap_or(0),
                iteration,
                images: RequestImages::default(),
                reasoning_effort: self.options.reasoning_effort,
                response_format: self.options.response_format.clone(),
            },
            ToolFormat::Xml => ModelRequest {
                system: format!("{system}\n\n{}", xml_format::tools_prompt(&tools)),
                messages: xml_format::as_text_protocol(&rest),
                tools: Vec::new(),
                turn: self.turn_index.unwrap_or(0),
                iteration,
                images: RequestImages::default(),
                reasoning_effort: self.options.reasoning_effort,
                response_format: self.options.response_format.clone(),
            },
        }
    }

    /// The bytes of the images `path` refers to, read from the store once
    /// per turn; none when neither the turn's model nor its fallbacks see
    /// images (they are shown placeholders). An image whose bytes are gone
    /// is left out: the provider names it as missing.
    async fn images(&mut self, path: &[Message]) -> Result<HashMap<String, Arc<[u8]>>, Stop> {
        let vision = std::iter::once(self.model)
            .chain(
                self.model
                    .info
                    .fallback
                    .iter()
                    .filter_map(|name| self.cx.models.get(name)),
            )
            .any(|m| m.info.capabilities.vision);
        let mut bytes = HashMap::new();
        if vision {
            for image in path.iter().flat_map(Message::images) {
                if bytes.contains_key(&image.sha256) {
                    continue;
                }
                if let Some(kept) = self.blobs.get(&image.sha256) {
                    bytes.insert(image.sha256.clone(), Arc::clone(kept));
                    continue;
                }
                match self.cx.store.blob(&image.sha256).await? {
                    Some(blob) => {
                        let kept: Arc<[u8]> = blob.bytes.into();
                        self.blobs.insert(image.sha256.clone(), Arc::clone(&kept));
                        bytes.insert(image.sha256.clone(), kept);
                    }
                    None => {
                        tracing::warn!(sha256 = %image.sha256, "an image of the path is missing from the store");
                    }
                }
            }
        }
        Ok(bytes)
    }

    /// What a stream event means to clients: an event to publish, nothing
    /// (recorded by the step, published with the stored message), or the
    /// end of the step (a provider error).
    pub(super) fn translate(&self, event: StreamEvent) -> Result<Option<AgentEvent>, Stop> {
        let run_id = self.run_id;
        let agent_event = match event {
            StreamEvent::TextDelta { text } => AgentEvent::TextDelta { run_id, text },
            StreamEvent::ReasoningDelta { text } => AgentEvent::ReasoningDelta { run_id, text },
            StreamEvent::ToolCallStarted {
                call_id,
                name,
                server,
            } => AgentEvent::ToolCallStarted {
                run_id,
                call_id: ToolCallId(call_id.to_string()),
                name,
                server,
            },
            StreamEvent::ArgumentsDelta { call_id, fragment } => AgentEvent::ArgumentsDelta {
                run_id,
                call_id: ToolCallId(call_id.to_string()),
                fragment,
            },
            StreamEvent::ArgumentField {
                call_id,
                key,
                value,
            } => AgentEvent::ArgumentField {
                run_id,
                call_id: ToolCallId(call_id.to_string()),
                key: key.to_string(),
                value,
            },
            StreamEvent::ProviderError { message } => {
                return Err(Stop::new(
                    StopReason::LlmApiError,
                    format!("the provider reported: {message}"),
                ));
            }
            StreamEvent::ParseError { message } => {
                tracing::warn!(conversation = %self.conversation, %message, "undecodable model output");
                return Ok(None);
            }
            StreamEvent::LimitExceeded { message } => {
                return Err(Stop::new(
                    StopReason::LlmApiError,
                    format!("the model's output went over a decoder limit: {message}"),
                ));
            }
            // Recorded by the step; published with the stored message.
            StreamEvent::ToolCallOpened { .. }
            | StreamEvent::ArgumentFieldDelta { .. }
            | StreamEvent::ToolCallReady { .. }
            | StreamEvent::ToolCallFailed { .. }
            | StreamEvent::Usage(_)
            | StreamEvent::Finished { .. } => return Ok(None),
        };
        Ok(Some(agent_event))
    }
}
