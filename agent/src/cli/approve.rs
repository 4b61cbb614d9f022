//! `toolwall approvals`, `toolwall approve ID`, `toolwall deny ID`: a person's side of the
//! calls an argument rule asks about (`approval.rs`). They talk to the running daemon over its
//! socket, as its user, from outside every session (the daemon refuses anyone else:
//! `daemon/api/approvals.rs`). An answer names its question by id and digest: `approve ID`
//! fetches what waits under ID and answers that (its digest), or, with `--digest`, exactly
//! what a listing showed earlier; the daemon refuses either if the question is not that one.

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
    /// The id `toolwall approvals` shows (`k3f9-1`).
    id: String,
    /// The digest `toolwall approvals` showed for the question: answer only if the question
    /// waiting under ID is still that one (without it, the question waiting now is answered).
    #[arg(long, value_name = "DIGEST")]
    digest: Option<String>,
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
                "DIGEST",
                "WAITING",
                "SESSION",
                "SERVER",
                "TOOL",
                "ARGUMENTS",
                "WHY",
            ],
        )
        .whole(6);
        let now = chrono::Utc::now();
        for q in &waiting {
            let cells = vec![
                q.id.to_string(),
                q.digest.clone(),
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

/// `toolwall approve ID` / `toolwall deny ID`: names the question by its id and digest (the
/// one given, else the one waiting under ID now) and says what it answered.
pub(crate) fn answer(args: AnswerArgs, approve: bool) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let api = daemon(args.config.as_deref()).await?;
        let digest = match args.digest {
            Some(digest) => Some(digest),
            // Not waiting (answered, or an id of an earlier run): the daemon says which, below.
            None => api
                .get_json::<Vec<Question>>("/api/approvals")
                .await?
                .into_iter()
                .find(|q| q.id.as_str() == args.id)
                .map(|q| q.digest),
        };
        let body = json!({ "approve": approve, "digest": digest, "reason": args.reason });
        let path = format!(
            "/api/approvals/{}",
            form_urlencoded::byte_serialize(args.id.as_bytes()).collect::<String>()
        );
        let answered = api.call(Method::POST, &path, body.to_string()).await?;
        let answered: Value =
            serde_json::from_slice(&answered).context("parse the daemon's answer")?;
        let question: Question = serde_json::from_value(answered["answered"].clone())
            .context("parse the daemon's answer")?;
        // What a server chose (names, arguments) is escaped, as every view escapes it:
        // unescaped, a name could forge this line or read as another.
        println!(
            "{} {}",
            if approve { "approved" } else { "denied" },
            question.describe()
        );
        Ok(ExitCode::SUCCESS)
    })
}
