//! `toolwall run`: the daemon that hosts every layer.
//!
//! Start-up follows one order (README "Running it") — config → registry (discovery of network servers) →
//! policy → event store → LLM proxy → kernel monitor → correlator → local API — and says on one
//! line per layer whether it is on, and why not when it is off. SIGINT/SIGTERM stop taking
//! work, flush every pending event to disk, detach the kernel programs and exit 0.

pub(crate) mod api;
mod audit_gate;
mod bundle;
mod endpoints;
mod feed;
mod layers;
mod metrics;
pub(crate) mod otlp;
mod peer;
mod process;
mod servers;
mod state;
mod stdio;
mod web;
mod webhook;

use std::{path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use anyhow::Context;
use clap::Args;
use tokio::sync::broadcast;

use endpoints::boundary_summary;
use layers::{start_netmon, start_proxy};
use process::{
    notify, raise_descriptor_limit, shutdown_signals, warn_if_ephemeral, warn_if_ptrace_is_open,
};
use servers::{check_server_users, discover_servers};
pub(crate) use state::{DaemonState, LayerStatus};

use crate::{
    config::Config,
    events::{EventSink, Store, spawn_committing_writer},
    policy::{InForce, LivePolicy, Policy},
    registry::Registry,
};

/// Arguments of `toolwall run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// YAML configuration; without it the embedded default is used (see `toolwall config default`).
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Print aya-log debug output from the kernel programs.
    #[arg(long)]
    pub kernel_log: bool,
}

/// Starts the daemon and runs it until SIGINT or SIGTERM.
pub(crate) fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    raise_descriptor_limit();
    // Before the runtime's threads: it unsets the variables systemd set.
    let activated = crate::listen::Activated::from_env("proxy.listen or api.listen")?;
    let runtime = tokio::runtime::Runtime::new().context("start the async runtime")?;
    runtime.block_on(serve(args, activated))
}

/// How long a client of the API socket may take to send a request's head, and then its body:
/// a slow one must not hold a descriptor for ever.
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long the store's integrity check may take at start: a big store is checked as far as
/// this allows (and `/health` says so).
const STORE_CHECK_BOUND: Duration = Duration::from_secs(5);

async fn serve(args: RunArgs, mut activated: crate::listen::Activated) -> anyhow::Result<ExitCode> {
    // 1. config
    let config = Config::load(args.config.as_deref())?;
    let db_path = config.store_path();
    tracing::info!(config = %config.origin, "configuration loaded");
    check_server_users(&config)?;

    // Held until the daemon exits: a second daemon on this store is refused, naming this one.
    let whose = match &args.config {
        Some(path) => std::path::absolute(path)
            .unwrap_or_else(|_| path.clone())
            .display()
            .to_string(),
        None => config.origin.clone(),
    };
    let _store_claim = crate::events::claim_store(&db_path, &whose)?;
    // A damaged store is set aside before anything reads it (`events/store/integrity.rs`).
    let checked = crate::events::check_at_start(&db_path, STORE_CHECK_BOUND)?;

    // 2. registry (persistent; discovery of declared network servers happens below, once the
    //    event store can record what it finds)
    let registry = Arc::new(
        Registry::open(&db_path)
            .with_context(|| format!("open the tool registry in {}", db_path.display()))?,
    );

    // 3. policy: the file's, or the last good signed bundle's when one is kept (a host that
    //    starts offline runs the fleet's policy; `daemon/bundle.rs`)
    let kept_verified = config
        .policy
        .bundle
        .as_ref()
        .and_then(|settings| bundle::kept(settings, &bundle::kept_path(&db_path)));
    // Its revision stays the floor even when it cannot run here.
    let kept_revision = kept_verified.as_ref().map(|v| v.revision);
    let min_revision = config.policy.bundle.as_ref().map_or(0, |b| b.min_revision);
    let kept_bundle = kept_verified.filter(|verified| {
        if verified.revision < min_revision {
            tracing::error!(
                revision = verified.revision,
                min_revision,
                "the kept policy bundle is older than policy.bundle.min_revision: not used"
            );
            return false;
        }
        match check_server_users(&bundle::effective(&config, verified)) {
            Ok(()) => true,
            Err(error) => {
                tracing::error!("the kept policy bundle is refused: {error:#}");
                false
            }
        }
    });
    let effective = match &kept_bundle {
        Some(verified) => {
            tracing::info!(
                revision = verified.revision,
                "starting with the kept policy bundle"
            );
            bundle::effective(&config, verified)
        }
        None => config.clone(),
    };
    let policy = LivePolicy::new(InForce {
        policy: Arc::new(Policy::new(&effective, registry.clone(), &[])?),
        mcp: Arc::new(effective.sandbox.mcp.clone()),
        revision: kept_bundle.as_ref().map(|v| v.revision),
    });

    // 4. event store: one writer thread, a live broadcast for followers
    let store = Store::open(&db_path)?;
    let (sink, rx) = EventSink::channel();
    if let Some(verified) = &kept_bundle {
        sink.set_policy_revision(verified.revision);
    }
    let (live_events, _) = broadcast::channel(4096);
    // The feed (`daemon/feed.rs`) starts after what is stored now, told of each commit.
    let feed_start = store.last_id()?.unwrap_or(0);
    let (committed, commits) = std::sync::mpsc::sync_channel(1);
    let (writer, committer) = spawn_committing_writer(store, rx, Some(committed));
    let store_health = committer.health();
    store_health.set_checked(checked);
    // What every layer asks: the policy, refusing calls the store cannot record.
    let gate = audit_gate::AuditGate::shared(
        policy.clone(),
        store_health.clone(),
        config.store.on_failure,
    );

    let mut layers = Vec::new();

    // Discovery: each declared network server's tools, registered (hashes, pinning) and
    // recorded. A server that cannot be reached is reported and does not hold up the others.
    let discovered = discover_servers(&effective, &policy.now().policy, &sink).await;
    layers.push(LayerStatus::on("registry", &discovered));

    // Calls an argument rule asks about wait here for a person (`approval.rs`).
    let webhook = effective.sandbox.mcp.approval.webhook.clone().map(|hook| {
        let (tx, rx) = tokio::sync::mpsc::channel(webhook::QUEUE);
        tokio::spawn(async move {
            if let Err(error) = webhook::run(hook, rx).await {
                tracing::error!("approval webhook stopped: {error:#}");
            }
        });
        tx
    });
    let approvals = Arc::new(crate::approval::Approvals::new(
        &effective.sandbox.mcp.approval,
        webhook,
    ));

    // 5. LLM proxy
    let (stop_proxy, proxy_stopped) = tokio::sync::watch::channel(false);
    let session_keys = Arc::new(crate::llm::proxy::SessionKeys::default());
    let mut llm_stats = None;
    let proxy_task = match start_proxy(
        &config,
        &gate,
        &sink,
        &session_keys,
        &approvals,
        &mut activated,
        proxy_stopped,
    )
    .await?
    {
        Some((addr, task, stats)) => {
            layers.push(LayerStatus::on(
                "llm-proxy",
                &format!(
                    "http://{addr} → anthropic {} / openai {} / gemini {} (mode {}; point agents at it with ANTHROPIC_BASE_URL / OPENAI_BASE_URL / GOOGLE_GEMINI_BASE_URL, or use `toolwall exec`)",
                    config.proxy.providers.anthropic,
                    config.proxy.providers.openai,
                    config.proxy.providers.gemini,
                    config.proxy.mode.as_str()
                ),
            ));
            llm_stats = Some(stats);
            Some((addr, task))
        }
        None => {
            layers.push(LayerStatus::off(
                "llm-proxy",
                "disabled in the configuration (proxy.mode: disabled)",
            ));
            None
        }
    };
    let proxy_addr = proxy_task.as_ref().map(|(addr, _)| *addr);

    // 6. kernel monitor
    // The API's loopback listener first: the kernel layer denies sessions its address (with
    // the web token, a root agent could otherwise read every session's records and answer its
    // own calls that wait for a person).
    let api_tcp = api::bind_http(config.api.listen, &mut activated).await?;
    activated.finish()?;
    let api_addr = api_tcp.local_addr()?;
    let own = endpoints::OwnEndpoints {
        api: api_addr,
        proxy: proxy_addr,
    };
    let netmon = match start_netmon(
        &effective,
        &policy.now().policy,
        &sink,
        own,
        args.kernel_log,
    )
    .await
    {
        Ok(service) => {
            layers.push(LayerStatus::on(
                "kernel",
                &format!(
                    "cgroup/connect4 + connect6 + sendmsg4 + sendmsg6 + post_bind4 + post_bind6 + sock_create ready, pinned under {}; attached to each session's cgroup by `toolwall exec`; session boundary: {}",
                    config.netmon.pin_dir.display(),
                    boundary_summary(&effective)
                ),
            ));
            Some(service)
        }
        Err(why) => {
            layers.push(LayerStatus::off("kernel", &why));
            None
        }
    };

    // Signed policy bundles: polled, verified, put in force for every layer at once.
    let (stop_bundles, bundles_stopped) = tokio::sync::watch::channel(false);
    let bundle_status = match &config.policy.bundle {
        Some(settings) => {
            let applier = bundle::Applier::new(
                &config,
                settings,
                policy.clone(),
                registry.clone(),
                sink.clone(),
                netmon.clone(),
                own,
                bundle::kept_path(&db_path),
                kept_revision,
            )?;
            let status = applier.status();
            layers.push(LayerStatus::on(
                "policy-bundle",
                &format!(
                    "{} every {} s, signed by {}; in force: {}",
                    settings.url,
                    settings.poll_secs,
                    settings.public_key,
                    match &kept_bundle {
                        Some(v) => format!("kept revision {}", v.revision),
                        None => "this file's policy until the first bundle".to_owned(),
                    }
                ),
            ));
            tokio::spawn(bundle::poll(applier, settings.clone(), bundles_stopped));
            Some(status)
        }
        None => None,
    };
    drop(effective);

    // Shims in other processes register the tools of stdio servers in the shared database;
    // reload so the LLM layer and the API see them.
    {
        let registry = registry.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            loop {
                tick.tick().await;
                let registry = registry.clone();
                match tokio::task::spawn_blocking(move || registry.reload()).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => tracing::warn!(%error, "reloading the registry failed"),
                    Err(error) => tracing::warn!(%error, "registry reload task failed"),
                }
            }
        });
    }

    // 7. correlator: joins the committed events into call records, streamed to followers
    //    (fed from the store with the metrics, below)
    let (live_calls, _) = broadcast::channel(1024);
    let window = Duration::from_millis(config.correlator.window_ms);
    layers.push(LayerStatus::on(
        "correlator",
        &format!("window {} ms", config.correlator.window_ms),
    ));

    // 7b. OTLP export: the store's events to a collector, behind a persisted cursor
    let (stop_export, export_stopped) = tokio::sync::watch::channel(false);
    let export = match config.telemetry.otlp.clone() {
        Some(otlp) => {
            let endpoint = format!("{} ({})", otlp.endpoint, otlp.protocol.as_str());
            let (stats, task) = otlp::start(otlp, db_path.clone(), window, export_stopped).await?;
            layers.push(LayerStatus::on(
                "otlp-export",
                &format!(
                    "events as log records and calls as spans to {endpoint}, resuming after event {}",
                    stats.cursor.load(std::sync::atomic::Ordering::Relaxed)
                ),
            ));
            Some((stats, task))
        }
        None => None,
    };

    // 8. local API (HTTP on loopback + Unix socket) and web view
    let state = Arc::new(DaemonState::new(state::DaemonParts {
        config,
        db_path: db_path.clone(),
        policy,
        sink,
        committer,
        live_events,
        live_calls,
        netmon,
        proxy_addr,
        layers,
        session_keys,
        approvals,
        export: export.as_ref().map(|(stats, _)| stats.clone()),
        bundle: bundle_status,
        llm_stats,
    }));
    // Metrics, live streams and the live correlator follow what the store committed, as
    // every view reads it, whichever process wrote it.
    feed::spawn(
        db_path.clone(),
        feed_start,
        commits,
        feed::Followers {
            events: state.live_events.clone(),
            calls: state.live_calls.clone(),
            metrics: state.metrics.clone(),
            window,
        },
    )?;
    if state.netmon.is_some() && state.proxy_addr.is_some() {
        warn_if_ptrace_is_open();
    }
    if state.netmon.is_some() {
        let mut ports = vec![("api.listen", api_addr.port())];
        ports.extend(proxy_addr.map(|a| ("proxy.listen", a.port())));
        warn_if_ephemeral(&ports);
    }
    let adopted = state.adopt_pinned_sessions();
    if adopted > 0 {
        tracing::warn!(
            sessions = adopted,
            "re-adopted sessions an earlier daemon left pinned; each is closed once its processes are gone"
        );
    }
    let reaper = {
        let state = state.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                state.reap_adopted_sessions();
            }
        })
    };
    let api = api::start(state.clone(), api_tcp).await?;

    for layer in &state.layers {
        if layer.on {
            tracing::info!("layer {}: on — {}", layer.name, layer.detail);
        } else {
            tracing::warn!("layer {}: OFF — {}", layer.name, layer.detail);
        }
    }
    let shutdown = shutdown_signals()?;
    println!("toolwall running");
    match proxy_addr {
        Some(addr) => println!(
            "  LLM proxy         http://{addr}  (ANTHROPIC_BASE_URL=http://{addr}, OPENAI_BASE_URL=http://{addr}/v1, GOOGLE_GEMINI_BASE_URL=http://{addr})"
        ),
        None => println!("  LLM proxy         off (proxy.mode: disabled)"),
    }
    println!("  API and web view  http://{}/", api.http_addr);
    println!(
        "  web view token    {} (this user only; open http://{}/#token=<its contents>)",
        api.token_file.display(),
        api.http_addr
    );
    println!("  API socket        {}", api.socket.display());
    println!("  event database    {}", db_path.display());
    println!("  stop with Ctrl-C or SIGTERM");
    // Under systemd (`Type=notify`, the package's unit): ready once every layer is up and the
    // API answers. Without NOTIFY_SOCKET this does nothing.
    let layers_on = state.layers.iter().filter(|l| l.on).count();
    notify(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(&format!(
            "{layers_on} of {} layers on; API http://{}/",
            state.layers.len(),
            api.http_addr
        )),
    ]);

    shutdown.await;
    notify(&[sd_notify::NotifyState::Stopping]);

    // Stop taking work, then flush: the API goes first so nothing new arrives, sessions are
    // closed (programs detached), and the writer drains every queued event before it returns.
    api.stop().await;
    let _ = stop_bundles.send(true);
    reaper.abort();
    let _ = reaper.await;
    let _ = stop_proxy.send(true);
    if let Some((_, task)) = proxy_task {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::error!(%error, "the LLM proxy failed while stopping"),
            Err(error) => tracing::error!(%error, "the LLM proxy task failed"),
        }
    }
    // The stdio servers the daemon runs end with it; their threads hold the state until then.
    if state.end_servers_of(None) > 0 {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while Arc::strong_count(&state) > 1 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    // The servers were killed: their cgroups close once their last process is reaped, a
    // moment later — waited for (2 s at most), or they stay pinned for a next daemon that may
    // never come (empty `…-mcp-…` cgroups were left behind).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while state.has_adopted_sessions() && tokio::time::Instant::now() < deadline {
        state.reap_adopted_sessions();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pending_sessions = state.close_all_sessions();
    if let Some(netmon) = &state.netmon {
        netmon.shutdown().await;
        match netmon.unpin_if_unused() {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                "sessions with processes stay pinned and enforced; the next `toolwall run` adopts them"
            ),
            Err(error) => tracing::error!(%error, "removing the kernel layer's pins"),
        }
    }
    let holders = Arc::strong_count(&state);
    if holders > 1 {
        tracing::error!(
            holders,
            "the daemon state is still shared at shutdown; events may be lost"
        );
    }
    drop(state);
    // A disk that keeps refusing no longer holds the stop up for ever.
    store_health.stop();
    let join = tokio::task::spawn_blocking(move || writer.join());
    let written = tokio::time::timeout(Duration::from_secs(30), join)
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "the event writer did not finish within 30 s; recent events may not be stored"
            )
        })?
        .context("join the event writer")?
        .map_err(|_| anyhow::anyhow!("the event writer panicked; some events may not be stored"))?;
    // The exporter stops where it is: what the collector has not taken stays behind the
    // cursor, and the next start sends it.
    let _ = stop_export.send(true);
    if let Some((_, task)) = export
        && tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .is_err()
    {
        tracing::warn!(
            "the OTLP exporter did not stop within 5 s; the next start sends what it had not"
        );
    }
    let unstored = store_health.unstored();
    if unstored > 0 {
        anyhow::bail!(
            "{unstored} events could not be stored ({}); {written} were",
            store_health.failing().unwrap_or_default()
        );
    }
    tracing::info!(
        events_written = written,
        sessions_closed = pending_sessions,
        "stopped cleanly"
    );
    Ok(ExitCode::SUCCESS)
}
