//! Signed policy bundles, the host's side: the daemon pulls `policy.bundle.url`
//! every `poll_secs` (with `If-None-Match`), verifies the bundle (`config/bundle.rs`), and puts
//! its `sandbox:` in force for every layer at once — the LLM proxy's and the daemon-run
//! shims' decisions through [`LivePolicy`], the kernel's rules through
//! [`NetmonService::set_endpoints`], the declared servers the daemon runs — without a
//! restart. The last good bundle is kept beside the store, so a host that starts offline
//! runs the fleet's policy, not only its own file's.
//!
//! A bundle is refused, reported (log, `/health`, `/metrics`) and the running policy kept when
//! its signature does not hold, its policy fails `config check`, its revision is not newer
//! than the one in force or below the host's floor (a replayed old bundle), or a stdio server
//! it declares names a user this host lacks. A change of `approval:` applies at the next start
//! (the questions waiting now were asked under the running settings); the rest at once.
//!
//! Stand-alone `toolwall shim` and `toolwall mcp-proxy` processes judge by their own
//! `--config`; the agents `toolwall exec` runs are governed by the daemon's policy.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use ed25519_dalek::VerifyingKey;
use http_body_util::{BodyExt as _, Empty, Limited};
use serde::Serialize;
use tokio::sync::watch;

use super::{
    endpoints::{OwnEndpoints, own_endpoints, watched_endpoints},
    servers::{check_server_users, discover_servers},
};
use crate::{
    config::{
        BundleConfig, Config,
        bundle::{self, MAX_BUNDLE_BYTES, Verified},
    },
    events::EventSink,
    netmon::service::NetmonService,
    policy::{InForce, LivePolicy, Policy},
    registry::Registry,
};

/// How long one fetch may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(30);

/// What `/health` and `/metrics` say about bundles.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct BundleStatus {
    /// Where bundles come from.
    pub url: String,
    /// The revision in force (`None`: the local file's policy, no bundle yet).
    pub revision: Option<u64>,
    /// When it was put in force.
    pub applied_at: Option<DateTime<Utc>>,
    /// Bundles applied since the daemon started (the kept one at start included).
    pub applied: u64,
    /// Bundles refused since the daemon started.
    pub refused: u64,
    /// The last poll.
    pub checked_at: Option<DateTime<Utc>>,
    /// Why the last poll failed or the last bundle was refused; cleared by the next success.
    pub last_error: Option<String>,
    /// What of the revision in force waits for a restart (its `approval:` settings).
    pub restart_needed_for: Option<String>,
}

/// Where the last good bundle is kept: beside the store (the package's `StateDirectory`).
pub(crate) fn kept_path(db: &Path) -> PathBuf {
    db.with_file_name("policy-bundle.json")
}

/// Puts bundles in force.
pub(crate) struct Applier {
    /// This host's file: everything but `sandbox:` comes from it.
    local: Config,
    key: VerifyingKey,
    policy: Arc<LivePolicy>,
    registry: Arc<Registry>,
    sink: EventSink,
    netmon: Option<NetmonService>,
    own: OwnEndpoints,
    kept: PathBuf,
    status: Arc<Mutex<BundleStatus>>,
    /// No revision below this is taken: `min_revision`, or the kept bundle's even when it
    /// could not be applied here (a replay must not undercut what this host already had).
    floor: u64,
}

impl Applier {
    /// An applier for `local`'s `policy.bundle`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        local: &Config,
        settings: &BundleConfig,
        policy: Arc<LivePolicy>,
        registry: Arc<Registry>,
        sink: EventSink,
        netmon: Option<NetmonService>,
        own: OwnEndpoints,
        kept: PathBuf,
        kept_revision: Option<u64>,
    ) -> anyhow::Result<Self> {
        let key = bundle::public_key(&settings.public_key)
            .map_err(|why| anyhow::anyhow!("policy.bundle.public_key: {why}"))?;
        let revision = policy.now().revision;
        Ok(Applier {
            local: local.clone(),
            key,
            policy,
            registry,
            sink,
            netmon,
            own,
            kept,
            floor: settings.min_revision.max(kept_revision.unwrap_or(0)),
            status: Arc::new(Mutex::new(BundleStatus {
                url: settings.url.clone(),
                revision,
                applied: u64::from(revision.is_some()),
                ..BundleStatus::default()
            })),
        })
    }

    /// What `/health` shows.
    pub(crate) fn status(&self) -> Arc<Mutex<BundleStatus>> {
        self.status.clone()
    }

    /// Verifies `bytes` and, if it is good and newer, puts it in force and keeps it.
    async fn take(&self, bytes: &[u8]) -> Result<Option<u64>, String> {
        let verified = bundle::open(bytes, &self.key).map_err(|e| e.to_string())?;
        let running = self.policy.now();
        if verified.revision < self.floor {
            return Err(format!(
                "revision {} is older than revision {}, the oldest this host takes (policy.bundle.min_revision, or the bundle it kept; a replayed bundle?)",
                verified.revision, self.floor
            ));
        }
        if running.revision == Some(verified.revision) {
            return Ok(None);
        }
        if let Some(current) = running.revision
            && verified.revision < current
        {
            return Err(format!(
                "revision {} is older than revision {current} in force (a replayed bundle?)",
                verified.revision
            ));
        }
        let effective = effective(&self.local, &verified);
        // The questions waiting now were asked under the running approval settings: a new
        // revision's rules apply at once, its `approval:` at the next start (which runs the
        // kept bundle whole) — said, not refused (refusing it would leave every host on its
        // own file's policy for ever).
        let restart_for = (effective.sandbox.mcp.approval != running.mcp.approval).then(|| {
            tracing::warn!(
                revision = verified.revision,
                "the bundle changes sandbox.mcp.approval: its rules apply now, its approval settings when the daemon restarts"
            );
            "sandbox.mcp.approval".to_owned()
        });
        check_server_users(&effective).map_err(|e| format!("{e:#}"))?;
        let policy = Policy::new(&effective, self.registry.clone(), &[])
            .map_err(|e| format!("revision {}: {e}", verified.revision))?;
        // The servers the running policy blocked on their listings stay blocked where this one
        // would block them too: in the kernel's rules as well (or the kernel layer would let
        // through connections to a server the MCP layer still blocks).
        policy.carry(&running.policy);
        // The kernel's rules first, then every other layer at once.
        if let Some(netmon) = &self.netmon {
            let mut endpoints = watched_endpoints(&effective, &policy);
            endpoints.extend(own_endpoints(self.own));
            netmon
                .set_endpoints(endpoints)
                .await
                .map_err(|e| format!("revision {}: the kernel's rules: {e}", verified.revision))?;
        }
        let policy = Arc::new(policy);
        {
            // One view for `/health`, which reads the revision in force under this lock: the
            // status changes with it (CI saw revision 3 in force beside revision 2's status).
            let mut status = self.status.lock().unwrap_or_else(|e| e.into_inner());
            self.policy.replace(InForce {
                policy: policy.clone(),
                mcp: Arc::new(effective.sandbox.mcp.clone()),
                revision: Some(verified.revision),
            });
            self.sink.set_policy_revision(verified.revision);
            status.revision = Some(verified.revision);
            status.applied_at = Some(Utc::now());
            status.applied += 1;
            status.restart_needed_for = restart_for;
        }
        // The network servers it declares are listed (registered, pinned) as at start — after
        // the swap, in the background: an unreachable one must not hold the new revision up
        // (until listed, its tools are unknown ones, blocked under fail_closed).
        let sink = self.sink.clone();
        tokio::spawn(async move {
            discover_servers(&effective, &policy, &sink).await;
        });
        if let Err(error) = keep(&self.kept, &verified.bytes) {
            tracing::error!(
                path = %self.kept.display(),
                "keeping the bundle for offline starts failed: {error:#}"
            );
        }
        Ok(Some(verified.revision))
    }
}

/// The configuration a bundle makes on this host: its file, with the bundle's `sandbox:`.
pub(crate) fn effective(local: &Config, verified: &Verified) -> Config {
    let mut config = local.clone();
    config.sandbox = verified.config.sandbox.clone();
    config.origin = format!(
        "{} with policy bundle revision {}",
        local.origin, verified.revision
    );
    config
}

/// The bundle kept by an earlier run, if it still verifies with the configured key.
pub(crate) fn kept(settings: &BundleConfig, path: &Path) -> Option<Verified> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
        Err(error) => {
            tracing::error!(path = %path.display(), %error, "cannot read the kept policy bundle");
            return None;
        }
    };
    let key = bundle::public_key(&settings.public_key).ok()?;
    match bundle::open(&bytes, &key) {
        Ok(verified) => Some(verified),
        Err(error) => {
            tracing::error!(path = %path.display(), %error, "the kept policy bundle is refused; starting with this file's policy until the server sends a good one");
            None
        }
    }
}

/// Writes the bundle beside the store: to a temporary file, then renamed (a crash leaves the
/// old one or the new one, never half of one), owner-only.
fn keep(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let tmp = path.with_extension("json.tmp");
    // A fresh file, never one a link points at (the daemon writes as root).
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("remove {}", tmp.display()));
        }
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("create {}", tmp.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("rename to {}", path.display()))
}

/// Polls until `stop`.
pub(crate) async fn poll(
    applier: Applier,
    settings: BundleConfig,
    mut stop: watch::Receiver<bool>,
) {
    let client = match client(&settings) {
        Ok(client) => client,
        Err(error) => {
            tracing::error!("policy.bundle: {error:#}; no bundle will be fetched");
            applier
                .status
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .last_error = Some(format!("{error:#}"));
            return;
        }
    };
    let mut etag: Option<http::HeaderValue> = None;
    let every = Duration::from_secs(settings.poll_secs);
    loop {
        let outcome = match fetch(&client, &settings.url, etag.as_ref()).await {
            Ok(Fetched::Unchanged) => Ok(None),
            Ok(Fetched::Body(bytes, tag)) => match applier.take(&bytes).await {
                Ok(applied) => {
                    etag = tag;
                    Ok(applied)
                }
                Err(why) => Err(format!("bundle refused: {why}")),
            },
            Err(error) => Err(format!("fetching {}: {error:#}", settings.url)),
        };
        {
            let mut status = applier.status.lock().unwrap_or_else(|e| e.into_inner());
            status.checked_at = Some(Utc::now());
            match &outcome {
                Ok(_) => status.last_error = None,
                Err(why) => {
                    if why.starts_with("bundle refused") {
                        status.refused += 1;
                    }
                    status.last_error = Some(why.clone());
                }
            }
        }
        match outcome {
            Ok(Some(revision)) => tracing::info!(
                revision,
                url = %settings.url,
                "policy bundle revision {revision} in force for every layer"
            ),
            Ok(None) => {}
            Err(why) => tracing::error!("policy.bundle: {why}; the running policy stays"),
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
    }
}

type Client = hyper_util::client::legacy::Client<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>,
    Empty<bytes::Bytes>,
>;

fn client(settings: &BundleConfig) -> anyhow::Result<Client> {
    let tls = match &settings.ca_file {
        Some(ca) => crate::edge::tls_client_config_with_ca(ca).context("policy.bundle.ca_file")?,
        None => crate::edge::tls_client_config()?,
    };
    let connector = crate::edge::https_connector(tls, Duration::from_secs(10));
    Ok(
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(connector),
    )
}

enum Fetched {
    Unchanged,
    Body(Vec<u8>, Option<http::HeaderValue>),
}

/// One GET, bounded in time and size.
async fn fetch(
    client: &Client,
    url: &str,
    etag: Option<&http::HeaderValue>,
) -> anyhow::Result<Fetched> {
    let mut request = http::Request::get(url).header(http::header::USER_AGENT, "toolwall");
    if let Some(tag) = etag {
        request = request.header(http::header::IF_NONE_MATCH, tag);
    }
    let request = request.body(Empty::new()).context("the bundle URL")?;
    let response = tokio::time::timeout(FETCH_TIMEOUT, async {
        let response = client.request(request).await?;
        let status = response.status();
        let tag = response.headers().get(http::header::ETAG).cloned();
        if status == http::StatusCode::NOT_MODIFIED {
            // "Unchanged" answers a question only when one was asked: a 304 to a plain GET
            // would freeze the host on what it runs without a word.
            anyhow::ensure!(
                etag.is_some(),
                "the server answered 304 Not Modified to a request that named no ETag"
            );
            return anyhow::Ok(Fetched::Unchanged);
        }
        anyhow::ensure!(status.is_success(), "the server answered {status}");
        let body = Limited::new(response.into_body(), MAX_BUNDLE_BYTES)
            .collect()
            .await
            .map_err(|e| {
                anyhow::anyhow!("reading the bundle (at most {MAX_BUNDLE_BYTES} bytes): {e}")
            })?
            .to_bytes();
        Ok(Fetched::Body(body.to_vec(), tag))
    })
    .await
    .map_err(|_| anyhow::anyhow!("no answer within {} s", FETCH_TIMEOUT.as_secs()))??;
    Ok(response)
}
