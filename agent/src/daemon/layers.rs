//! Starting the layers the daemon hosts besides the API: the LLM proxy and the kernel monitor
//! (the live correlator follows the store: `daemon/feed.rs`).

use std::{sync::Arc, time::Duration};

use anyhow::Context;

use super::endpoints::{OwnEndpoints, boundary_mode, own_endpoints, watched_endpoints};
use crate::{
    config::{Config, ProxyMode},
    events::EventSink,
    llm::{LlmProxy, LlmProxySettings},
    netmon::{KernelMonitor, service::NetmonService},
    policy::Policy,
};

/// Binds the LLM proxy (a bind failure stops start-up: the user asked for it) and runs it until
/// `stopped` turns true; `None` when `proxy.mode` is `disabled`.
pub(super) async fn start_proxy(
    config: &Config,
    gate: &Arc<dyn crate::decision::Gate>,
    sink: &EventSink,
    session_keys: &Arc<crate::llm::proxy::SessionKeys>,
    approvals: &Arc<crate::approval::Approvals>,
    activated: &mut crate::listen::Activated,
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
        gemini_upstream: config.proxy.providers.gemini.clone(),
        on_malformed: config.interceptor.on_malformed,
        max_stream_buffer: usize::try_from(config.interceptor.max_stream_buffer_bytes)
            .unwrap_or(usize::MAX),
        session_id: String::new(),
        session_keys: session_keys.clone(),
        pass_through: config
            .proxy
            .pass_through
            .iter()
            .map(|e| crate::config::PassThrough::parse(e.provider, &e.route))
            .collect::<Result<_, _>>()
            .context("proxy.pass_through")?,
        max_connections_per_client: usize::try_from(config.proxy.max_connections_per_client)
            .unwrap_or(usize::MAX),
        memory_budget: usize::try_from(config.proxy.memory_budget_bytes).unwrap_or(usize::MAX),
        ..LlmProxySettings::default()
    };
    let proxy = match activated.take(config.proxy.listen, "proxy.listen")? {
        Some(held) => LlmProxy::on(
            tokio::net::TcpListener::from_std(held).context("serve the socket systemd holds")?,
            settings,
            gate.clone(),
            sink.clone(),
        ),
        None => LlmProxy::bind(settings, gate.clone(), sink.clone()).await,
    }
    .with_context(|| {
        format!(
            "start the LLM proxy on {} (proxy.listen){}",
            config.proxy.listen,
            crate::listen::held_by(config.proxy.listen.port())
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
pub(super) async fn start_netmon(
    config: &Config,
    policy: &Policy,
    sink: &EventSink,
    own: OwnEndpoints,
    kernel_log: bool,
) -> Result<NetmonService, String> {
    if !config.netmon.enabled {
        return Err("disabled in the configuration (netmon.enabled: false)".into());
    }
    let mut monitor =
        KernelMonitor::load(kernel_log, &config.netmon.pin_dir).map_err(|e| e.to_string())?;
    if monitor.unix_missing().is_none() {
        monitor
            .sync_unix_listed(&unix_listed(config)?)
            .map_err(|e| e.to_string())?;
    }
    let mut endpoints = watched_endpoints(config, policy);
    endpoints.extend(own_endpoints(own));
    let every = Duration::from_secs(config.netmon.resolve_interval_secs.max(1));
    let watch = Duration::from_millis(config.netmon.watch_interval_ms.max(10));
    let boundary = boundary_mode(config);
    if boundary == crate::netmon::boundary::BoundaryMode::Off {
        tracing::warn!(
            "netmon.egress.mode is open: sessions reach this host's other services and the networks around it (docs/sessions.md)"
        );
    }
    NetmonService::start(monitor, endpoints, boundary, sink.clone(), every, watch)
        .await
        .map_err(|e| e.to_string())
}

/// The Unix sockets every session may reach: the daemon's API socket and `exec.allow_unix`.
fn unix_listed(config: &Config) -> Result<Vec<agent_common::unix::UnixName>, String> {
    let api = crate::config::socket_path(config.api.socket.as_deref());
    let api =
        agent_common::unix::UnixName::of(api.as_os_str().as_encoded_bytes()).ok_or_else(|| {
            format!(
                "api.socket {} is too long for a Unix socket address",
                api.display()
            )
        })?;
    let mut names = vec![api];
    for entry in &config.exec.allow_unix {
        names.push(crate::config::unix_name(entry)?);
    }
    Ok(names)
}
