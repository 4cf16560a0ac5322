//! The `toolwire` binary: command-line parsing and wiring of the library
//! crates. Errors are `anyhow` here and only here.

mod stream_decode;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

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
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Stream(StreamCommand::Decode(args)) => stream_decode::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("toolwire: {e:#}");
            ExitCode::FAILURE
        }
    }
}
