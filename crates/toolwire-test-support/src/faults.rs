//! Error answers as the real provider APIs send them (status, headers and
//! body, from the shapes recorded in the project's provider-error
//! fixtures), so that fault tests meet the failures users meet.

use crate::mock_model::Reply;

/// OpenAI's 429 on requests per minute, with `retry-after: retry_after`
/// (seconds, or whatever a test wants the client to make of it).
pub fn openai_rate_limit(retry_after: &str) -> Reply {
    Reply::Status {
        code: 429,
        headers: vec![
            ("retry-after".into(), retry_after.into()),
            ("x-ratelimit-reset-requests".into(), "1s".into()),
        ],
        body: r#"{"error":{"message":"Rate limit reached for gpt-4o in organization org-x on requests per min (RPM): Limit 500, Used 500, Requested 1. Please try again in 120ms.","type":"requests","param":null,"code":"rate_limit_exceeded"}}"#.into(),
    }
}

/// OpenAI's server error (`code` 500 or 503).
pub fn openai_server_error(code: u16) -> Reply {
    Reply::Status {
        code,
        headers: Vec::new(),
        body: r#"{"error":{"message":"The server had an error while processing your request. Sorry about that!","type":"server_error","param":null,"code":null}}"#.into(),
    }
}

/// Anthropic's overloaded answer (HTTP 529).
pub fn anthropic_overloaded() -> Reply {
    Reply::Status {
        code: 529,
        headers: Vec::new(),
        body: r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
            .into(),
    }
}

/// An Anthropic stream that starts (HTTP 200, `message_start`, some text)
/// and then reports an error as an SSE event, as the API does when it is
/// overloaded mid-answer.
pub fn anthropic_error_mid_stream(text_before: &str) -> Reply {
    let mut body = crate::sse::anthropic_sse(text_before, &[]);
    // Everything up to the end of the text block, then the error event in
    // place of the message's end.
    let cut = body.find("event: message_delta").unwrap_or(body.len());
    body.truncate(cut);
    body.push_str(
        "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n",
    );
    Reply::sse(body)
}

/// OpenAI's answer to a request over the model's context window (HTTP
/// 400, `context_length_exceeded`).
pub fn openai_context_exceeded(window: u64, tokens: u64) -> Reply {
    Reply::Status {
        code: 400,
        headers: Vec::new(),
        body: format!(
            r#"{{"error":{{"message":"This model's maximum context length is {window} tokens. However, your messages resulted in {tokens} tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}}}"#
        ),
    }
}

/// Anthropic's answer to a prompt over the model's window (HTTP 400,
/// `prompt is too long`).
pub fn anthropic_prompt_too_long(window: u64, tokens: u64) -> Reply {
    Reply::Status {
        code: 400,
        headers: Vec::new(),
        body: format!(
            r#"{{"type":"error","error":{{"type":"invalid_request_error","message":"prompt is too long: {tokens} tokens > {window} maximum"}}}}"#
        ),
    }
}
