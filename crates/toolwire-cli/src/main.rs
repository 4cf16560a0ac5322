//! The `toolwire` binary: command-line parsing and wiring of the library
//! crates. Errors are `anyhow` here and only here.

mod acp;
mod chat;
mod config;
mod exec;
mod render;
mod serve;
mod stream_decode;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

/// jemalloc, not glibc's malloc: a plain message builds and drops many
/// small JSON values and rows, and glibc spent about a fifth of the
/// server's CPU on them (consolidating and unlinking free chunks); a long
/// path read's memory is also kept for reuse rather than given back and
/// faulted in again. See docs/performance.md.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// toolwire: an agent runtime that makes every tool call visible and
/// controllable, from the moment the model writes its name.
#[derive(Debug, Parser)]
#[command(name = "toolwire", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the HTTP API: Letta-compatible agents, tools and messages
    /// (JSON and SSE), with human approval and client-side tools.
    Serve(serve::ServeArgs),
    /// Run one turn without a UI: the answer on stdout, tool activity on
    /// stderr (or every event as JSON lines with --json). Exits 0 when the
    /// model gave its final answer.
    Exec(exec::ExecArgs),
    /// Talk to the agent in the terminal. Tool calls show the moment their
    /// name is known; a line typed during a turn reaches the agent at the
    /// next tool result; Ctrl-C cancels the turn; /help lists commands.
    Chat(chat::ChatArgs),
    /// Be an Agent Client Protocol (v1) agent on stdin/stdout, for editors
    /// such as Zed; each session's cwd is the root of its built-in tools.
    Acp(acp::AcpArgs),
    /// Work with recorded model streams.
    #[command(subcommand)]
    Stream(StreamCommand),
}

#[derive(Debug, Subcommand)]
enum StreamCommand {
    /// Decode a recorded stream into tool-call events, one JSON object per
    /// line, each with `offset`: the input bytes consumed when it was
    /// emitted.
    Decode(stream_decode::DecodeArgs),
}

fn main() -> ExitCode {
    // The sandbox helper first: a process per command, so nothing else
    // (logging, a runtime) may cost it time.
    if std::env::args_os()
        .nth(1)
        .is_some_and(|a| a == config::SANDBOX_SUBCOMMAND)
    {
        toolwire_sandbox::helper::main(std::env::args_os().skip(2));
    }
    let cli = Cli::parse();
    // Logs go to stderr (stdout carries answers and protocols); RUST_LOG
    // adjusts the level. An editor keeps an ACP agent's stderr as its log:
    // there the front door's own lines (sessions, answers remembered, each
    // session's update metrics at the end) show by default.
    let default_filter = match cli.command {
        Command::Acp(_) => "warn,toolwire_acp=info",
        _ => "warn",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter)),
        )
        .with_writer(std::io::stderr)
        .init();
    if !matches!(cli.command, Command::Stream(_)) {
        // These run tools: their commands must not read this process's
        // /proc/PID/environ (the provider keys) where the sandbox has no
        // PID namespace of its own. Before any thread starts.
        if let Err(e) = toolwire_sandbox::protect_process() {
            tracing::warn!(
                "could not make toolwire's process non-dumpable (PR_SET_DUMPABLE): {e}; without \
                 a PID namespace, commands may read its environment"
            );
        }
    }
    let result = match cli.command {
        Command::Serve(args) => runtime().and_then(|rt| rt.block_on(serve::run(&args))),
        Command::Exec(args) => runtime().and_then(|rt| rt.block_on(exec::run(&args))),
        Command::Acp(args) => runtime().and_then(|rt| rt.block_on(acp::run(&args))),
        Command::Chat(args) => runtime().and_then(|rt| rt.block_on(chat::run(&args))),
        Command::Stream(StreamCommand::Decode(args)) => {
            stream_decode::run(&args).map(|()| ExitCode::SUCCESS)
        }
    };
    match result {
        Ok(code) => code,
        // The reader went away (`toolwire exec … | head`): not an error.
        Err(e) if is_broken_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("toolwire: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}
