//! Decisions of a shim or filter proxy running inside a `toolwall exec` session, made by the
//! session's daemon as well as locally.
//!
//! The daemon holds the registry, the version pins and the rate-limit buckets that the LLM
//! layer uses too; asking it for every call counts a server's budget once across the proxy and
//! every shim of every session (a proposal seen by the LLM layer and its execution here spend
//! one call, see `policy::RateLimiter`). The local policy (`--deny`, `--config`) still applies:
//! a call or tool passes only if both allow it. When the daemon does not answer, the answer is
//! *block* (fail closed), with the reason saying so — a shim in a watched session never runs a
//! tool nobody decided on.
//!
//! [`Gate`] is synchronous (the filter is sans-IO), so requests go to a small thread with its
//! own runtime and the caller waits for the answer, at most [`DAEMON_TIMEOUT`].

use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use bytes::Bytes;
use serde_json::{Value, json};

use crate::client::ApiClient;
use crate::decision::{Action, CallQuery, Decision, Gate};

/// How long a decision may wait for the daemon before it is a block.
pub const DAEMON_TIMEOUT: Duration = Duration::from_secs(10);

struct Job {
    path: &'static str,
    body: Bytes,
    reply: mpsc::SyncSender<anyhow::Result<Bytes>>,
}

/// The local policy and the daemon's, both asked; the stricter answer wins.
pub struct DaemonGate {
    local: Arc<dyn Gate>,
    socket: PathBuf,
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
}

impl DaemonGate {
    /// A gate that asks `local` and then the daemon on `socket`. Starts the requesting thread;
    /// fails only if no thread or runtime can be started.
    pub fn new(local: Arc<dyn Gate>, socket: &Path) -> anyhow::Result<Self> {
        let (jobs, mut rx) = tokio::sync::mpsc::unbounded_channel::<Job>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let path = socket.to_path_buf();
        std::thread::Builder::new()
            .name("toolwall-daemon-gate".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let api = ApiClient::new(&path);
                    while let Some(job) = rx.recv().await {
                        let answer = tokio::time::timeout(
                            DAEMON_TIMEOUT,
                            api.call(http::Method::POST, job.path, job.body),
                        )
                        .await
                        .unwrap_or_else(|_| {
                            Err(anyhow::anyhow!(
                                "no answer within {} s",
                                DAEMON_TIMEOUT.as_secs()
                            ))
                        });
                        // The asker may have given up; nothing to do then.
                        let _ = job.reply.send(answer);
                    }
                })
            })?;
        Ok(DaemonGate {
            local,
            socket: socket.to_path_buf(),
            jobs,
        })
    }

    /// `POST path` to the daemon and its answer, parsed.
    fn ask<T: serde::de::DeserializeOwned>(
        &self,
        path: &'static str,
        body: Value,
    ) -> Result<T, String> {
        let (reply, answer) = mpsc::sync_channel(1);
        let job = Job {
            path,
            body: Bytes::from(body.to_string()),
            reply,
        };
        self.jobs
            .send(job)
            .map_err(|_| "the daemon client thread stopped".to_owned())?;
        let bytes = answer
            .recv_timeout(DAEMON_TIMEOUT + Duration::from_secs(1))
            .map_err(|_| format!("no answer within {} s", DAEMON_TIMEOUT.as_secs()))?
            .map_err(|e| format!("{e:#}"))?;
        serde_json::from_slice(&bytes).map_err(|e| format!("unexpected answer to {path}: {e}"))
    }

    /// The block a failed request turns into.
    fn unreachable(&self, why: &str) -> Decision {
        tracing::error!(socket = %self.socket.display(), why, "the session's daemon did not decide; blocking");
        Decision {
            action: Action::Block,
            reason: format!(
                "the toolwall daemon on {} did not decide ({why}); fail closed",
                self.socket.display()
            ),
            tool: None,
        }
    }
}

impl Gate for DaemonGate {
    fn check_call(&self, call: &CallQuery<'_>) -> Decision {
        let local = self.local.check_call(call);
        if local.is_blocked() {
            return local;
        }
        let body = json!({
            "server_id": call.server_id,
            "name": call.name,
            "namespace": call.namespace,
            "stage": call.stage,
        });
        match self.ask::<Decision>("/api/check", body) {
            // An alert of the local policy (a changed definition under `on_change: alert`)
            // stays with the call when the daemon has nothing to say.
            Ok(decision) if !decision.is_blocked() && decision.reason.is_empty() => Decision {
                reason: local.reason,
                ..decision
            },
            Ok(decision) => decision,
            Err(why) => Decision {
                tool: local.tool,
                ..self.unreachable(&why)
            },
        }
    }

    fn check_listed(&self, server_id: &str, server_type: &str, tool: &Value) -> Decision {
        let local = vec![self.local.check_listed(server_id, server_type, tool)];
        self.listed(
            server_id,
            server_type,
            std::slice::from_ref(tool),
            local,
            false,
        )
        .pop()
        .unwrap_or_else(|| self.unreachable("no decision for the tool"))
    }

    fn check_listed_all(
        &self,
        server_id: &str,
        server_type: &str,
        tools: &[Value],
    ) -> Vec<Decision> {
        let local = self.local.check_listed_all(server_id, server_type, tools);
        self.listed(server_id, server_type, tools, local, true)
    }
}

impl DaemonGate {
    /// The daemon's decisions on `tools`, each the stricter of it and `local`'s.
    fn listed(
        &self,
        server_id: &str,
        server_type: &str,
        tools: &[Value],
        local: Vec<Decision>,
        whole: bool,
    ) -> Vec<Decision> {
        let body = json!({
            "server_id": server_id,
            "server_type": server_type,
            "tools": tools,
            "whole": whole,
        });
        let remote = match self.ask::<Vec<Decision>>("/api/listed", body) {
            Ok(remote) if remote.len() == local.len() => remote,
            Ok(remote) => {
                let why = format!("{} decisions for {} tools", remote.len(), local.len());
                return local.into_iter().map(|_| self.unreachable(&why)).collect();
            }
            Err(why) => return local.into_iter().map(|_| self.unreachable(&why)).collect(),
        };
        local
            .into_iter()
            .zip(remote)
            .map(|(local, remote)| if local.is_blocked() { local } else { remote })
            .collect()
    }
}
