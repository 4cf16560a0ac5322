//! `toolwire acp`: the Agent Client Protocol agent on stdin/stdout, until
//! the client closes stdin. Logs go to stderr only: stdout is the protocol.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;

use crate::config::EngineArgs;

#[derive(Debug, Args)]
pub struct AcpArgs {
    #[command(flatten)]
    engine: EngineArgs,
}

pub async fn run(args: &AcpArgs) -> Result<ExitCode> {
    // Kept to the end: the file watcher runs as long as `running`.
    let running = args.engine.resolve()?.start().await?;
    toolwire_acp::serve_stdio(running.engine.clone()).await?;
    Ok(ExitCode::SUCCESS)
}
