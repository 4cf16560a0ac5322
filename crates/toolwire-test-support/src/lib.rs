//! # toolwire-test-support
//!
//! **Owns** what the integration tests of the engine, the server and the
//! CLI share: the mock model server ([`mock_model`]: real HTTP/1.1 and SSE
//! on loopback, replies scripted per request, every request recorded,
//! faults such as error statuses, cut streams, stalls and slow chunks), the
//! SSE bodies of OpenAI chat, OpenAI Responses and Anthropic ([`sse`]),
//! Anthropic's prompt cache as the mock reports it ([`anthropic_cache`]), the provider error
//! bodies the real APIs send ([`faults`]), models with a context window
//! that refuse a request over it as the real APIs do ([`window`]), engines over a temporary SQLite
//! file with the scripted or any provider ([`engine`]), echo tools
//! ([`tools`]), process checks ([`processes`]), sandboxes through a crate's
//! helper binary ([`sandbox`]), MCP servers on loopback ([`mcp_http`]) and
//! scratch PostgreSQL databases ([`scratch_pg`], also the load benches').
//!
//! **Invariants.** Dev-only (`publish = false`, only ever a
//! dev-dependency). The only stand-in is the model: everything else a test
//! builds here is real (SQLite file, TCP sockets, processes). Binds only
//! 127.0.0.1.
//!
//! Helpers fail the test that called them (they panic with what went
//! wrong): a test helper has no caller to hand an error to. The one
//! exception is [`scratch_pg`], whose errors a bench reports as its own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

pub mod anthropic_cache;
pub mod engine;
pub mod faults;
pub mod mcp_http;
pub mod mock_model;
pub mod processes;
pub mod sandbox;
pub mod scratch_pg;
pub mod sse;
pub mod tools;
pub mod window;

// Flat names, so that a test's `use toolwire_test_support as support;`
// reads as `support::MockServer`, `support::openai_sse`.
pub use anthropic_cache::PromptCache;
pub use engine::{
    engine, engine_at, event_types, http, model_entry, script, scripted_engine, sqlite_store,
    type_of,
};
pub use mock_model::{MockServer, Received, Reply, Request, read_request};
pub use processes::{gone, marker, none_with, running_with, some_with};
pub use scratch_pg::ScratchDatabase;
pub use sse::{
    Call, anthropic_sse, anthropic_sse_with_usage, openai_sse, openai_sse_with_usage, responses_sse,
};
pub use tools::{EchoTool, echo_tool, echo_tools};
pub use window::{Answer, Windowed, Wire, is_summary_request, request_tokens};
