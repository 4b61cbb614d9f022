//! `toolwall approvals`, `toolwall approve ID`, `toolwall deny ID`: a person's side of the
//! calls an argument rule asks about (`approval.rs`). They talk to the running daemon over its
//! socket, as its user, from outside every session (the daemon refuses anyone else:
//! `daemon/api/approvals.rs`).

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context;
use clap::Args;
use http::Method;
use serde_json::{Value, json};

use crate::{approval::Question, client::ApiClient, config::Config, views::Output};

/// Arguments of `toolwall approvals`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Configuration (for the daemon's socket).
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// JSON lines instead of a table.
    #[arg(long)]
    json: bool,
}

/// Arguments of `toolwall approve` and `toolwall deny`.
#[derive(Debug, Args)]
pub struct AnswerArgs {
    /// The number `toolwall approvals` shows.
    id: u64,
    /// Why (kept in the call's record; the client is told).
    #[arg(long)]
    reason: Option<String>,
    /// Configuration (for the daemon's socket).
    #[arg(long, short)]
    config: Option<PathBuf>,
}

async fn daemon(config: Option<&std::path::Path>) -> anyhow::Result<ApiClient> {
    let config = Config::load(config)?;
    let socket = crate::config::prepare_socket_dir(config.api.socket.as_deref(), false)?;
    // Questions live in the running daemon only: there is no database to fall back to.
    ApiClient::connect(&socket).await
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("start the async runtime")
}

/// `toolwall approvals`: the calls waiting for a person.
pub(crate) fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let api = daemon(args.config.as_deref()).await?;
        let waiting: Vec<Question> = api.get_json("/api/approvals").await?;
        // The arguments are what a person decides on: never cut (a value past a cut cell
        // would be hidden from the one deciding).
        let mut out = Output::new(
            args.json,
            &[
                "ID",
                "WAITING",
                "SESSION",
                "SERVER",
                "TOOL",
                "ARGUMENTS",
                "WHY",
            ],
        )
        .whole(5);
        let now = chrono::Utc::now();
        for q in &waiting {
            let cells = vec![
                q.id.to_string(),
                format!(
                    "{}s of {}s",
                    (now - q.asked_at).num_seconds().max(0),
                    (q.expires_at - q.asked_at).num_seconds()
                ),
                crate::approval::session_label(q).to_owned(),
                q.server_id.clone(),
                q.tool.clone(),
                q.arguments
                    .as_ref()
                    .map(Value::to_string)
                    .unwrap_or_else(|| "-".into()),
                q.reason.clone(),
            ];
            out.row(q, cells)?;
        }
        out.flush()?;
        if waiting.is_empty() && !args.json {
            eprintln!("toolwall: no call waits for a person");
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `toolwall approve ID` / `toolwall deny ID`.
pub(crate) fn answer(args: AnswerArgs, approve: bool) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let api = daemon(args.config.as_deref()).await?;
        let body = json!({ "approve": approve, "reason": args.reason });
        let answered = api
            .call(
                Method::POST,
                &format!("/api/approvals/{}", args.id),
                body.to_string(),
            )
            .await?;
        let answered: Value =
            serde_json::from_slice(&answered).context("parse the daemon's answer")?;
        let q = &answered["answered"];
        // Names a server chose: escaped, as every view does (unescaped, a name could forge
        // this line).
        let field = |key: &str, none: &str| {
            crate::views::printable(
                q[key]
                    .as_str()
                    .filter(|s| !s.is_empty())
                    .unwrap_or(none)
                    .to_owned(),
            )
        };
        println!(
            "{} approval {}: {} on {} (session {}) with {}",
            if approve { "approved" } else { "denied" },
            args.id,
            field("tool", "?"),
            field("server_id", "?"),
            field("session_id", "-"),
            crate::views::printable(q["arguments"].to_string()),
        );
        Ok(ExitCode::SUCCESS)
    })
}
