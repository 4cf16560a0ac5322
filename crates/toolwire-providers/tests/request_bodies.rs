//! The exact bytes each provider sends for a variety of requests: text,
//! tool calls and results (one left unanswered), notifications, images
//! seen and not, reasoning effort, response formats, the OpenAI hosts
//! that want `max_completion_tokens`, the XML tool format and Anthropic's
//! prompt-cache breakpoints. A model's prompt cache keys on these bytes,
//! so a change to how a body is built must leave them as they are.

#![allow(clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};
use toolwire_core::{
    BlobRef, ContentBlock, ConversationId, Message, Priority, Role, ToolCallId, ToolSpec,
};
use toolwire_providers::{
    AnthropicProvider, DEFAULT_MAX_TOKENS, HttpSettings, ModelRequest, OpenAiProvider,
    OpenAiResponsesProvider, ReasoningEffort, RequestImages, RetryPolicy, StreamLimits, xml_format,
};

const PNG: &[u8] = b"\x89PNG\r\n\x1a\nfake png";
const JPEG: &[u8] = b"\xff\xd8\xffjpeg bytes";

fn settings(base_url: &str, max_tokens: u32) -> HttpSettings {
    HttpSettings {
        base_url: base_url.into(),
        api_key: None,
        retry: RetryPolicy::default(),
        headers: Vec::new(),
        limits: StreamLimits::default(),
        max_tokens,
    }
}

const LOCAL: &str = "http://127.0.0.1:1/v1";

fn openai(base_url: &str, native_tools: bool) -> OpenAiProvider {
    OpenAiProvider::new(
        settings(base_url, DEFAULT_MAX_TOKENS),
        "gpt-test",
        native_tools,
    )
}

fn responses(native_tools: bool) -> OpenAiResponsesProvider {
    OpenAiResponsesProvider::new(settings(LOCAL, DEFAULT_MAX_TOKENS), "o4-mini", native_tools)
}

fn anthropic(max_tokens: u32) -> AnthropicProvider {
    AnthropicProvider::new(settings(LOCAL, max_tokens), "claude-test", true)
}

/// The body bytes as text (UTF-8 JSON).
fn text(body: Result<Vec<u8>, toolwire_providers::ProviderError>) -> String {
    String::from_utf8(body.expect("a body encodes")).expect("a body is UTF-8")
}

fn openai_body(p: &OpenAiProvider, r: &ModelRequest) -> String {
    text(p.body(r))
}

fn responses_body(p: &OpenAiResponsesProvider, r: &ModelRequest) -> String {
    text(p.body(r))
}

fn anthropic_body(p: &AnthropicProvider, r: &ModelRequest) -> String {
    text(p.body(r))
}

fn message(role: Role, content: Vec<ContentBlock>) -> Message {
    Message::new(ConversationId::new(), None, role, content)
}

fn say(t: &str) -> ContentBlock {
    ContentBlock::Text { text: t.into() }
}

fn call(id: &str, name: &str, arguments: Value) -> ContentBlock {
    ContentBlock::ToolUse {
        id: ToolCallId(id.into()),
        server: None,
        name: name.into(),
        arguments,
    }
}

fn result(id: &str, content: &str, is_error: bool, images: Vec<BlobRef>) -> ContentBlock {
    ContentBlock::ToolResult {
        tool_use_id: ToolCallId(id.into()),
        content: content.into(),
        is_error,
        images,
    }
}

fn notification(text: &str) -> ContentBlock {
    ContentBlock::Notification {
        source: "watcher".into(),
        priority: Priority::High,
        text: text.into(),
    }
}

fn tools() -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "read_file".into(),
            server: None,
            description: "Reads a file: \"path\" relative to the workspace.".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "The file."},
                    "range": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2},
                },
                "required": ["path"],
                "additionalProperties": false,
            }),
            read_only: true,
        },
        ToolSpec {
            name: "search".into(),
            server: Some("docs".into()),
            description: "Searches — fast, with ünïcode and a tab\there.".into(),
            parameters: json!({"type": "object", "properties": {"q": {"type": "string", "default": "x", "maximum": 1.5}}}),
            read_only: true,
        },
    ]
}

/// A path with everything the wire formats treat apart: a user message
/// with a notification, an assistant message with text and two calls, the
/// results stored out of order with one call never answered and one
/// error, a result carrying a notification, then a follow-up and a plain
/// answer.
fn rich_path() -> Vec<Message> {
    vec![
        message(
            Role::User,
            vec![
                say("Read a.txt and b.txt, \"quoted\" and\nnew-lined </script> 😀"),
                notification("build finished"),
            ],
        ),
        message(
            Role::Assistant,
            vec![
                say("Reading "),
                say("both."),
                call(
                    "call_a",
                    "read_file",
                    json!({"path": "a.txt", "range": [1, 2]}),
                ),
                call("call_b", "read_file", json!({"path": "b.txt"})),
                call("call_c", "search", json!({"q": "ünï \u{1} ctl"})),
            ],
        ),
        message(
            Role::Tool,
            vec![result("call_c", "no hits", true, Vec::new())],
        ),
        message(
            Role::Tool,
            vec![
                result("call_a", "A's text", false, Vec::new()),
                notification("tests are red"),
            ],
        ),
        message(Role::User, vec![say("and now?")]),
        message(Role::Assistant, vec![say("Done.")]),
        message(Role::User, vec![say("thanks")]),
    ]
}

/// A user message with an image, a call whose result carries an image,
/// and a result with no text and an image.
fn image_path() -> (Vec<Message>, RequestImages) {
    let seen = BlobRef::of("image/png", PNG);
    let shot = BlobRef::of("image/jpeg", JPEG);
    let gone = BlobRef::of("image/png", b"never stored");
    let path = vec![
        message(
            Role::User,
            vec![say("what is this?"), ContentBlock::Image(seen.clone())],
        ),
        message(
            Role::Assistant,
            vec![
                call("c1", "screenshot", json!({})),
                call("c2", "screenshot", json!({"window": 2})),
            ],
        ),
        message(
            Role::Tool,
            vec![
                result("c1", "taken", false, vec![shot.clone(), gone]),
                result("c2", "", false, vec![seen.clone()]),
            ],
        ),
        message(Role::User, vec![ContentBlock::Image(shot.clone())]),
    ];
    let mut bytes = HashMap::new();
    bytes.insert(seen.sha256.clone(), Arc::<[u8]>::from(PNG));
    bytes.insert(shot.sha256.clone(), Arc::<[u8]>::from(JPEG));
    (
        path,
        RequestImages {
            vision: true,
            bytes,
        },
    )
}

fn request(system: &str, messages: Vec<Message>, tools: Vec<ToolSpec>) -> ModelRequest {
    ModelRequest {
        system: system.into(),
        messages,
        tools: tools.into_iter().map(Arc::new).collect(),
        turn: 0,
        iteration: 1,
        images: RequestImages::default(),
        reasoning_effort: None,
        response_format: None,
    }
}

fn json_schema_format() -> Value {
    json!({"type": "json_schema", "json_schema": {
        "name": "answer",
        "description": "The answer.",
        "schema": {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
        "strict": true,
    }})
}

#[test]
fn openai_chat_bodies() {
    let rich = request("be brief", rich_path(), tools());
    insta::assert_snapshot!("openai_rich", openai_body(&openai(LOCAL, true), &rich));

    let mut asked = rich.clone();
    asked.reasoning_effort = Some(ReasoningEffort::Medium);
    asked.response_format = Some(json_schema_format());
    insta::assert_snapshot!(
        "openai_effort_and_format",
        openai_body(&openai("https://api.openai.com/v1", true), &asked)
    );

    let bare = request("", vec![message(Role::User, vec![say("hi")])], Vec::new());
    insta::assert_snapshot!(
        "openai_azure_bare",
        openai_body(
            &openai(
                "https://team.openai.azure.com/openai/deployments/x?api-version=1",
                true
            ),
            &bare
        )
    );

    let mut object = bare.clone();
    object.response_format = Some(json!({"type": "json_object"}));
    object.system = "sys".into();
    insta::assert_snapshot!(
        "openai_json_object",
        openai_body(&openai(LOCAL, true), &object)
    );
    insta::assert_snapshot!(
        "openai_no_messages",
        openai_body(&openai(LOCAL, true), &request("", Vec::new(), Vec::new()))
    );
}

#[test]
fn openai_chat_with_the_xml_tool_format() {
    let path = rich_path();
    let xml = ModelRequest {
        system: format!(
            "be brief\n\n{}",
            xml_format::tools_prompt(&tools().into_iter().map(Arc::new).collect::<Vec<_>>())
        ),
        messages: xml_format::as_text_protocol(&path),
        ..request("", Vec::new(), Vec::new())
    };
    insta::assert_snapshot!("openai_xml", openai_body(&openai(LOCAL, false), &xml));
    // Tools given to a provider without native tools are not sent.
    let given = request("be brief", rich_path(), tools());
    insta::assert_snapshot!(
        "openai_xml_tools_not_sent",
        openai_body(&openai(LOCAL, false), &given)
    );
}

#[test]
fn openai_chat_images() {
    let (path, shown) = image_path();
    let mut seen = request("look", path, Vec::new());
    seen.images = shown;
    insta::assert_snapshot!(
        "openai_images_seen",
        openai_body(&openai(LOCAL, true), &seen)
    );
    let mut blind = seen.clone();
    blind.images.vision = false;
    insta::assert_snapshot!(
        "openai_images_blind",
        openai_body(&openai(LOCAL, true), &blind)
    );
}

#[test]
fn openai_responses_bodies() {
    let mut rich = request("be brief", rich_path(), tools());
    insta::assert_snapshot!("responses_rich", responses_body(&responses(true), &rich));
    rich.reasoning_effort = Some(ReasoningEffort::High);
    rich.response_format = Some(json_schema_format());
    insta::assert_snapshot!(
        "responses_effort_and_schema",
        responses_body(&responses(false), &rich)
    );
    let mut bare = request(
        "",
        vec![message(Role::System, vec![say("sys")])],
        Vec::new(),
    );
    bare.response_format = Some(json!({"type": "json_object"}));
    insta::assert_snapshot!(
        "responses_json_object",
        responses_body(&responses(true), &bare)
    );
    bare.response_format = Some(json!({"type": "text"}));
    bare.messages.push(message(Role::Assistant, Vec::new()));
    insta::assert_snapshot!(
        "responses_text_format",
        responses_body(&responses(true), &bare)
    );
    // A schema without its optional fields.
    bare.response_format =
        Some(json!({"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}));
    insta::assert_snapshot!(
        "responses_schema_only",
        responses_body(&responses(true), &bare)
    );

    let (path, shown) = image_path();
    let mut seen = request("", path, Vec::new());
    seen.images = shown;
    insta::assert_snapshot!(
        "responses_images_seen",
        responses_body(&responses(true), &seen)
    );
    seen.images.vision = false;
    insta::assert_snapshot!(
        "responses_images_blind",
        responses_body(&responses(true), &seen)
    );
}

#[test]
fn anthropic_bodies() {
    let rich = request("be brief", rich_path(), tools());
    insta::assert_snapshot!(
        "anthropic_rich",
        anthropic_body(&anthropic(DEFAULT_MAX_TOKENS), &rich)
    );
    insta::assert_snapshot!(
        "anthropic_rich_uncached",
        anthropic_body(
            &anthropic(DEFAULT_MAX_TOKENS).with_prompt_caching(false),
            &rich
        )
    );
    let mut thinking = rich.clone();
    thinking.reasoning_effort = Some(ReasoningEffort::High);
    // Anthropic has no response_format: it is not sent.
    thinking.response_format = Some(json_schema_format());
    insta::assert_snapshot!(
        "anthropic_thinking",
        anthropic_body(&anthropic(32_000), &thinking)
    );
    insta::assert_snapshot!(
        "anthropic_no_room_to_think",
        anthropic_body(&anthropic(1024), &thinking)
    );

    // No system, no tools, one question; then none at all.
    let bare = request("", vec![message(Role::User, vec![say("hi")])], Vec::new());
    insta::assert_snapshot!(
        "anthropic_bare",
        anthropic_body(&anthropic(DEFAULT_MAX_TOKENS), &bare)
    );
    insta::assert_snapshot!(
        "anthropic_no_messages",
        anthropic_body(
            &anthropic(DEFAULT_MAX_TOKENS),
            &request("", Vec::new(), Vec::new())
        )
    );
    // Empty messages are left out; an assistant message first.
    let gaps = request(
        "s",
        vec![
            message(Role::Assistant, vec![say("hello")]),
            message(Role::User, vec![say("")]),
            message(Role::System, vec![say("from the system")]),
            message(Role::Assistant, Vec::new()),
            message(Role::User, vec![say("q")]),
        ],
        Vec::new(),
    );
    insta::assert_snapshot!(
        "anthropic_gaps",
        anthropic_body(&anthropic(DEFAULT_MAX_TOKENS), &gaps)
    );
}

#[test]
fn anthropic_images() {
    let (path, shown) = image_path();
    let mut seen = request("look", path, tools());
    seen.images = shown;
    insta::assert_snapshot!(
        "anthropic_images_seen",
        anthropic_body(&anthropic(DEFAULT_MAX_TOKENS), &seen)
    );
    seen.images.vision = false;
    insta::assert_snapshot!(
        "anthropic_images_blind",
        anthropic_body(&anthropic(DEFAULT_MAX_TOKENS), &seen)
    );
}

/// A long tool loop: the last breakpoint before the last assistant
/// message lands on the results of the step before.
#[test]
fn anthropic_a_long_tool_loop() {
    let mut path = vec![message(Role::User, vec![say("go")])];
    for i in 0..3 {
        let id = format!("c{i}");
        path.push(message(
            Role::Assistant,
            vec![call(&id, "read_file", json!({"path": format!("{i}.txt")}))],
        ));
        path.push(message(
            Role::Tool,
            vec![result(&id, "ok", false, Vec::new())],
        ));
    }
    path.push(message(Role::Assistant, vec![say("all read")]));
    let loop_request = request("be brief", path, tools());
    insta::assert_snapshot!(
        "anthropic_tool_loop",
        anthropic_body(&anthropic(DEFAULT_MAX_TOKENS), &loop_request)
    );
    insta::assert_snapshot!(
        "openai_tool_loop",
        openai_body(&openai(LOCAL, true), &loop_request)
    );
    insta::assert_snapshot!(
        "responses_tool_loop",
        responses_body(&responses(true), &loop_request)
    );
}
