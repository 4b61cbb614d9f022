//! `toolwall run`: the daemon that hosts every layer.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context;
use clap::Args;

/// Arguments of `toolwall run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// YAML configuration; without it the embedded default is used (see `toolwall config default`).
    #[arg(long, short)]
    pub config: Option<PathBuf>,
}

/// Starts the daemon and runs it until SIGINT or SIGTERM.
pub fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Runtime::new().context("start the async runtime")?;
    runtime.block_on(async move {
        let _ = args;
        wait_for_shutdown().await?;
        Ok(ExitCode::SUCCESS)
    })
}

/// Resolves on the first SIGINT or SIGTERM.
async fn wait_for_shutdown() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = int.recv() => tracing::info!("SIGINT: shutting down"),
    }
    Ok(())
}
