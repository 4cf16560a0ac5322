//! `toolwire serve`: the HTTP server — the Letta-compatible API — on the
//! engine, until Ctrl-C or SIGTERM.

use std::net::SocketAddr;
use std::process::ExitCode;

use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use toolwire_server::{AppState, ServerSettings};

use crate::config::EngineArgs;

#[derive(Debug, Args)]
#[command(after_help = "\
Browser safety and connection limits (config file keys):
  allowed_hosts = [\"NAME\", \"NAME:PORT\"]  names the server also answers to
      (always: localhost, 127.0.0.1, [::1] and the listen address; others get 403)
  allowed_origins = [\"https://HOST\"]   web pages that may also send changes and
      open WebSockets (always: the server's own page; clients that send no
      Origin header, such as the SDKs and curl, are not affected)
  max_connections = 512     connections at once; more wait to be accepted
  header_timeout_secs = 10  time for a request's head to arrive
  body_timeout_secs = 30    time for a request's body to arrive after its head (else 408)
  idle_timeout_secs = 30    time a kept-alive connection waits for a request
JSON bodies must be sent as Content-Type: application/json (else 415).")]
pub struct ServeArgs {
    /// Address to listen on. Without API keys (api_keys in the config, or
    /// TOOLWIRE_API_KEYS) only a loopback address is allowed.
    #[arg(
        long,
        env = "TOOLWIRE_ADDR",
        default_value = "127.0.0.1:8283",
        value_name = "ADDR"
    )]
    addr: SocketAddr,
    /// On SIGTERM or Ctrl-C: seconds running turns get to reach their next
    /// stored step (new turns are refused with 503 meanwhile) before they
    /// are cut and stored as interrupted [config: shutdown_grace_secs;
    /// default 10].
    #[arg(long, env = "TOOLWIRE_SHUTDOWN_GRACE_SECS", value_name = "SECS")]
    shutdown_grace_secs: Option<f64>,
    /// Instances on one PostgreSQL database: seconds an instance may go
    /// without a heartbeat before the others interrupt its turns and take
    /// over its notifications (an instance whose process or database
    /// connection is gone is noticed at the next sweep, every third of
    /// this) [config: failover_secs; default 30].
    #[arg(long, env = "TOOLWIRE_FAILOVER_SECS", value_name = "SECS")]
    failover_secs: Option<f64>,
    #[command(flatten)]
    engine: EngineArgs,
}

pub async fn run(args: &ServeArgs) -> Result<ExitCode> {
    let mut settings = args.engine.resolve()?;
    if let Some(secs) = args.failover_secs {
        let after = crate::config::failover_after(secs)
            .with_context(|| format!("--failover-secs {secs}"))?;
        settings.engine.stale_owner_after = after;
        settings.engine.heartbeat_interval = after / 3;
    }
    let defaults = ServerSettings::default();
    let shutdown_grace = match args.shutdown_grace_secs {
        Some(secs) => Duration::try_from_secs_f64(secs)
            .with_context(|| format!("--shutdown-grace-secs {secs}"))?,
        None => settings.shutdown_grace.unwrap_or(defaults.shutdown_grace),
    };
    let mut server = ServerSettings {
        api_keys: settings.api_keys.clone(),
        python: settings.python.clone(),
        allowed_hosts: settings.http.allowed_hosts.clone(),
        allowed_origins: settings.http.allowed_origins.clone(),
        max_connections: settings.http.max_connections,
        header_timeout: settings.http.header_timeout,
        body_timeout: settings.http.body_timeout,
        idle_timeout: settings.http.idle_timeout,
        shutdown_grace,
        ..defaults
    };
    // Refused before the engine starts, so a bad address costs nothing.
    let listener = toolwire_server::bind(args.addr, &server).await?;
    // Kept to the end: the file watcher runs as long as `running`.
    let running = settings.start().await?;
    server.python_sandbox = running.python_sandbox();
    let engine = running.engine.clone();
    let addr = listener.local_addr()?;
    eprintln!(
        "toolwire: serving on http://{addr} (model {}, database {})",
        engine.model(),
        settings.db
    );
    eprintln!("toolwire: open http://{addr}/ in a browser for the live conversation view");
    eprintln!(
        "toolwire: Letta-compatible API at http://{addr}/v1, OpenAPI at http://{addr}/openapi.json"
    );
    if let Some(root) = running.watching() {
        eprintln!(
            "toolwire: watching {} for changes (told to the agent as notifications)",
            root.display()
        );
    }
    if server.api_keys.is_empty() {
        eprintln!("toolwire: no API keys configured: listening on loopback only");
    }
    let state = AppState::new(engine, server);
    toolwire_server::serve(listener, state, shutdown_signal()).await?;
    running.stop().await;
    eprintln!("toolwire: stopped");
    Ok(ExitCode::SUCCESS)
}

/// Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
    eprintln!(
        "toolwire: shutting down: new turns are refused (503), running ones stop at their next stored step"
    );
}
