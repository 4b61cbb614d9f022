//! `toolwall run`: the daemon that hosts every layer.
//!
//! Start-up follows one order (README "Running it") — config → registry (discovery of network servers) →
//! policy → event store → LLM proxy → kernel monitor → correlator → local API — and says on one
//! line per layer whether it is on, and why not when it is off. SIGINT/SIGTERM stop taking
//! work, flush every pending event to disk, detach the kernel programs and exit 0.

pub(crate) mod api;
mod audit_gate;
mod bundle;
mod metrics;
pub(crate) mod otlp;
mod peer;
mod state;
mod stdio;
mod web;
mod webhook;

use std::{path::PathBuf, process::ExitCode, sync::Arc, time::Duration};

use anyhow::Context;
use clap::Args;
use tokio::sync::broadcast;

pub(crate) use state::{DaemonState, LayerStatus};

use crate::{
    config::{Config, OtherResolvers, ProxyMode, ServerType},
    correlate::Correlator,
    decision::Gate,
    events::{EventSink, Store, spawn_committing_writer},
    llm::{LlmProxy, LlmProxySettings},
    netmon::{
        KernelMonitor, RuleAction,
        service::{NetmonService, WatchedEndpoint},
    },
    policy::{InForce, LivePolicy, Policy},
    registry::{Registry, value_hash},
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
    let runtime = tokio::runtime::Runtime::new().context("start the async runtime")?;
    runtime.block_on(serve(args))
}

/// How long a client of the API socket may take to send a request's head, and then its body:
/// a slow one must not hold a descriptor for ever.
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Tells systemd (when it started the daemon) how the daemon is; a failure is logged, never
/// fatal: the daemon works the same without a supervisor listening.
fn notify(states: &[sd_notify::NotifyState<'_>]) {
    if let Err(error) = sd_notify::notify(false, states) {
        tracing::warn!(%error, "could not notify systemd (NOTIFY_SOCKET)");
    }
}

/// Every declared stdio server's `user:` must exist here (found at start, not at the first
/// call); one without runs as the agent that asks, which can reach into it: said once, here.
fn check_server_users(config: &Config) -> anyhow::Result<()> {
    for server in &config.sandbox.mcp.servers {
        if server.server_type != crate::config::ServerType::Stdio {
            continue;
        }
        match &server.user {
            Some(name) => {
                let user = crate::exec::lookup_user(name).with_context(|| {
                    format!(
                        "{}: sandbox.mcp.servers {:?}: `user: {name}`",
                        config.origin, server.id
                    )
                })?;
                anyhow::ensure!(
                    user.uid != 0,
                    "{}: sandbox.mcp.servers {:?}: `user: {name}` is root, and root leaves any confinement toolwall sets (its egress limit included): name an unprivileged user of the server's own",
                    config.origin,
                    server.id
                );
            }
            None => tracing::warn!(
                server = %server.id,
                "declared stdio server without `user:` runs as the agent that asks for it, which can then reach into it (its memory, its files); give it a user of its own"
            ),
        }
    }
    Ok(())
}

/// Lifts the soft limit on open descriptors to the hard one: every session's proxy connections,
/// shims' pipes and servers hold some, and running out stops the API and the kernel watch.
fn raise_descriptor_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read and write the struct we own.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            let soft = limit.rlim_cur;
            limit.rlim_cur = limit.rlim_max;
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                tracing::debug!(
                    from = soft,
                    to = limit.rlim_max,
                    "raised the descriptor limit"
                );
            }
        }
    }
}

async fn serve(args: RunArgs) -> anyhow::Result<ExitCode> {
    // 1. config
    let config = Config::load(args.config.as_deref())?;
    let db_path = config.store_path();
    tracing::info!(config = %config.origin, "configuration loaded");
    check_server_users(&config)?;

    // 2. registry (persistent; discovery of declared network servers happens below, once the
    //    event store can record what it finds)
    let registry = Arc::new(
        Registry::open(&db_path)
            .with_context(|| format!("open the tool registry in {}", db_path.display()))?,
    );
    // Held until the daemon exits: a second daemon on this store is refused, naming this one.
    let _store_claim = crate::events::claim_store(&db_path, &config.origin.to_string())?;

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
    let (writer, committer) = spawn_committing_writer(store, rx, live_events.clone());
    let store_health = committer.health();
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
        proxy_stopped,
    )
    .await?
    {
        Some((addr, task, stats)) => {
            layers.push(LayerStatus::on(
                "llm-proxy",
                &format!(
                    "http://{addr} → anthropic {} / openai {} (mode {}; point agents at it with ANTHROPIC_BASE_URL / OPENAI_BASE_URL, or use `toolwall exec`)",
                    config.proxy.providers.anthropic,
                    config.proxy.providers.openai,
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
    let api_tcp = api::bind_http(config.api.listen).await?;
    let api_addr = api_tcp.local_addr()?;
    let netmon = match start_netmon(
        &effective,
        &policy.now().policy,
        &sink,
        api_addr,
        args.kernel_log,
    )
    .await
    {
        Ok(service) => {
            layers.push(LayerStatus::on(
                "kernel",
                &format!(
                    "cgroup/connect4 + connect6 + sendmsg4 + sendmsg6 ready, pinned under {}; attached to each session's cgroup by `toolwall exec`",
                    config.netmon.pin_dir.display()
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
                api_addr,
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

    // 7. correlator: joins live events into call records, streamed to followers
    let (live_calls, _) = broadcast::channel(1024);
    let window = Duration::from_millis(config.correlator.window_ms);
    tokio::spawn(correlate_live(
        live_events.subscribe(),
        live_calls.clone(),
        window,
    ));
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
    // Metrics count what the store committed, as every view reads it.
    tokio::spawn(state.metrics.clone().follow(state.live_events.subscribe()));
    if state.netmon.is_some() && state.proxy_addr.is_some() {
        warn_if_ptrace_is_open();
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
            "  LLM proxy         http://{addr}  (ANTHROPIC_BASE_URL=http://{addr}, OPENAI_BASE_URL=http://{addr}/v1)"
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

/// How long discovery waits for each network server (connect, initialize, every page).
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// Lists the tools of every declared network server (all at once), registers them through the
/// policy (hashes, version pinning) and records `mcp_tool_seen` / `mcp_tool_changed`. Returns a
/// one-line summary for the start-up report.
async fn discover_servers(config: &Config, policy: &Policy, sink: &EventSink) -> String {
    use crate::mcp::client::{Transport, discover};
    let servers: Vec<_> = config
        .sandbox
        .mcp
        .servers
        .iter()
        .filter(|s| s.server_type != ServerType::Stdio)
        .collect();
    if servers.is_empty() {
        return "no network MCP servers declared; stdio servers register through `toolwall shim`"
            .into();
    }
    let lookups = servers.iter().map(|server| async move {
        let transport = match server.server_type {
            ServerType::Sse => Transport::Sse,
            _ => Transport::Auto,
        };
        let url = server.url.as_deref().unwrap_or_default();
        (
            server,
            discover(url, transport, Default::default(), DISCOVERY_TIMEOUT).await,
        )
    });
    let mut found = 0;
    let mut failed = Vec::new();
    for (server, result) in futures_util::future::join_all(lookups).await {
        match result {
            Ok(discovered) => {
                let decisions = policy.check_listed_all(
                    &server.id,
                    discovered.transport.server_type(),
                    &discovered.tools,
                );
                for event in policy.listing_events("", &decisions) {
                    sink.emit(event);
                }
                let hidden = decisions.iter().filter(|d| d.is_blocked()).count();
                tracing::info!(server = %server.id, tools = discovered.tools.len(), hidden, "discovered");
                found += 1;
            }
            Err(error) => {
                tracing::warn!(server = %server.id, url = server.url.as_deref().unwrap_or_default(), %error, "discovery failed; its tools stay as last registered");
                failed.push(server.id.as_str());
            }
        }
    }
    if failed.is_empty() {
        format!("{found} network server(s) discovered")
    } else {
        format!(
            "{found} network server(s) discovered; unreachable: {} (see the warnings above)",
            failed.join(", ")
        )
    }
}

/// Binds the LLM proxy (a bind failure stops start-up: the user asked for it) and runs it until
/// `stopped` turns true; `None` when `proxy.mode` is `disabled`.
async fn start_proxy(
    config: &Config,
    gate: &Arc<dyn crate::decision::Gate>,
    sink: &EventSink,
    session_keys: &Arc<crate::llm::proxy::SessionKeys>,
    approvals: &Arc<crate::approval::Approvals>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<
    Option<(
        std::net::SocketAddr,
        tokio::task::JoinHandle<anyhow::Result<()>>,
        Arc<crate::llm::RelayStats>,
    )>,
> {
    if config.proxy.mode == ProxyMode::Disabled {
        return Ok(None);
    }
    let settings = LlmProxySettings {
        listen: config.proxy.listen,
        anthropic_upstream: config.proxy.providers.anthropic.clone(),
        openai_upstream: config.proxy.providers.openai.clone(),
        on_malformed: config.interceptor.on_malformed,
        max_stream_buffer: usize::try_from(config.interceptor.max_stream_buffer_bytes)
            .unwrap_or(usize::MAX),
        session_id: String::new(),
        session_keys: session_keys.clone(),
        ..LlmProxySettings::default()
    };
    let proxy = LlmProxy::bind(settings, gate.clone(), sink.clone())
        .await
        .with_context(|| {
            format!(
                "start the LLM proxy on {} (proxy.listen)",
                config.proxy.listen
            )
        })?
        .with_approvals(approvals.clone())?;
    let addr = proxy.local_addr()?;
    let stats = proxy.stats();
    let task = tokio::spawn(proxy.run(async move {
        let _ = stopped.wait_for(|s| *s).await;
    }));
    Ok(Some((addr, task, stats)))
}

/// Loads and starts the kernel layer, or says why it is off.
async fn start_netmon(
    config: &Config,
    policy: &Policy,
    sink: &EventSink,
    api: std::net::SocketAddr,
    kernel_log: bool,
) -> Result<NetmonService, String> {
    if !config.netmon.enabled {
        return Err("disabled in the configuration (netmon.enabled: false)".into());
    }
    let monitor =
        KernelMonitor::load(kernel_log, &config.netmon.pin_dir).map_err(|e| e.to_string())?;
    let mut endpoints = watched_endpoints(config, policy);
    endpoints.extend(api_endpoints(api));
    let every = Duration::from_secs(config.netmon.resolve_interval_secs.max(1));
    let watch = Duration::from_millis(config.netmon.watch_interval_ms.max(10));
    NetmonService::start(monitor, endpoints, sink.clone(), every, watch)
        .await
        .map_err(|e| e.to_string())
}

/// Which addresses the kernel watches: every network MCP server (DENY when the server is
/// denied by policy or must be reached through `toolwall mcp-proxy`, else FLAG), and with
/// `netmon.pin_llm_egress` the LLM providers' API hosts (DENY: the session must use the proxy).
/// The daemon's own loopback API, denied to sessions: a process inside one talks to the daemon
/// through the socket, which knows where it runs; on TCP it could present the web token (a root
/// agent can read it) and read every session's records or answer its own calls that wait for a
/// person.
fn api_endpoints(api: std::net::SocketAddr) -> Vec<WatchedEndpoint> {
    let hosts = match api.ip() {
        ip if ip.is_unspecified() => vec!["0.0.0.0/0".to_owned(), "::/0".to_owned()],
        ip => vec![ip.to_string()],
    };
    hosts
        .into_iter()
        .map(|host| WatchedEndpoint {
            id: "toolwall:api".into(),
            kind: "api".into(),
            host,
            port: api.port(),
            action: RuleAction::Deny,
            except: Vec::new(),
        })
        .collect()
}

pub(crate) fn watched_endpoints(config: &Config, policy: &Policy) -> Vec<WatchedEndpoint> {
    let mut out = Vec::new();
    for server in &config.sandbox.mcp.servers {
        if server.server_type == ServerType::Stdio {
            continue;
        }
        let Some((host, port)) = split_host_port(&server.addr()) else {
            continue;
        };
        let deny =
            policy.server_block_reason(&server.id).is_some() || config.must_use_proxy(server);
        out.push(WatchedEndpoint {
            id: server.id.clone(),
            kind: server.server_type.as_str().to_owned(),
            host,
            port,
            action: if deny {
                RuleAction::Deny
            } else {
                RuleAction::Flag
            },
            except: Vec::new(),
        });
    }
    if config.netmon.pin_llm_egress {
        for (name, url) in [
            ("anthropic", &config.proxy.providers.anthropic),
            ("openai", &config.proxy.providers.openai),
        ] {
            if let Some((host, port)) = split_host_port(&crate::config::url_host_port(url)) {
                out.push(WatchedEndpoint {
                    id: format!("llm:{name}"),
                    kind: "llm".into(),
                    host,
                    port,
                    action: RuleAction::Deny,
                    except: Vec::new(),
                });
            }
        }
    }
    let dns = &config.netmon.dns;
    let other = match dns.other_resolvers {
        OtherResolvers::Off => return out,
        OtherResolvers::Flag => RuleAction::Flag,
        OtherResolvers::Deny => RuleAction::Deny,
    };
    let allowed = if dns.resolvers.is_empty() {
        crate::netmon::local::system_resolvers()
    } else {
        dns.resolvers.clone()
    };
    if allowed.is_empty() {
        tracing::warn!(
            action = ?other,
            "netmon.dns: no resolver is allowed (none in netmon.dns.resolvers, none in /etc/resolv.conf); all DNS from sessions is treated as going to another resolver"
        );
    }
    out.push(WatchedEndpoint {
        id: "dns:other-resolver".into(),
        kind: "dns".into(),
        host: "::/0".into(),
        port: 53,
        action: other,
        except: allowed,
    });
    out
}

fn split_host_port(addr: &str) -> Option<(String, u16)> {
    let (host, port) = addr.rsplit_once(':')?;
    Some((host.trim_matches(['[', ']']).to_owned(), port.parse().ok()?))
}

/// Feeds the live event stream through the correlator and publishes finished records.
async fn correlate_live(
    mut events: broadcast::Receiver<crate::events::StoredEvent>,
    calls: broadcast::Sender<crate::correlate::CallRecord>,
    window: Duration,
) {
    let mut correlator = Correlator::new(window, value_hash);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            received = events.recv() => match received {
                Ok(event) => {
                    for record in correlator.push(&event) {
                        let _ = calls.send(record);
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    tracing::warn!(missed = n, "live correlator fell behind; `toolwall mcp calls` (from the store) stays complete");
                }
                Err(broadcast::error::RecvError::Closed) => break,
            },
            _ = tick.tick() => {
                for record in correlator.expire(chrono::Utc::now()) {
                    let _ = calls.send(record);
                }
            }
        }
    }
    for record in correlator.flush() {
        let _ = calls.send(record);
    }
}

/// Resolves on the first SIGINT or SIGTERM.
/// SIGTERM and SIGINT, caught from the moment this is called (before the daemon says it is
/// ready: a supervisor may stop it at once, and must find it stopping cleanly).
fn shutdown_signals() -> anyhow::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
    })
}

/// Sessions are told apart by cgroup (`llm/proxy/sessions.rs`), but a process of an agent's
/// user outside its session can ptrace the agent where Yama allows it (attack 45: gdb and
/// `pidfd_getfd` took the agent's connection to the LLM proxy and spoke as its session).
fn warn_if_ptrace_is_open() {
    let scope = std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope").ok();
    if scope.as_deref().map(str::trim).is_none_or(|s| s == "0") {
        tracing::warn!(
            "kernel.yama.ptrace_scope is {}: a process of an agent's user outside its session can trace the agent and act as it; run agents as a user of their own (`toolwall exec --user`) or set kernel.yama.ptrace_scope=1",
            scope.as_deref().map_or("absent (no Yama)", |s| s.trim())
        );
    }
}
