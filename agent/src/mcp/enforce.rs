//! What the stand-alone MCP commands (`toolwall shim`, `toolwall mcp-proxy`) enforce and where
//! they record it: the same [`Policy`] the daemon runs (the configuration, or the embedded
//! default, plus the command line's `--deny` regexes), and with `--config` or `--db` the shared
//! registry and event database, written directly (safe beside the daemon and other shims).
//! Inside a `toolwall exec` session ([`session_daemon`]) neither judges nor records: what runs
//! inside a session could forge it. The shim becomes a pipe to a server the daemon runs
//! (`mcp/relay.rs`); the filter proxy refuses to start there.

use std::{path::PathBuf, sync::Arc, thread::JoinHandle};

use anyhow::Context;

use crate::{
    approval::Asker,
    config::{ArgumentAction, Config},
    decision::Gate,
    events::{EventSink, Store, spawn_writer},
    policy::Policy,
    registry::Registry,
};

/// Splits one `--deny` value into patterns at commas that are not inside `{}`, `[]` or `()`
/// and not escaped, so `^file_.*$,.*_database$` is two patterns and `a{1,3}` stays one.
pub(crate) fn split_patterns(value: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start, mut escaped) = (0i32, 0usize, false);
    for (i, c) in value.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        match c {
            '\\' => escaped = true,
            '{' | '[' | '(' => depth += 1,
            '}' | ']' | ')' => depth -= 1,
            ',' if depth <= 0 => {
                out.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&value[start..]);
    out
}

/// Every pattern of the `--deny` values, split at top-level commas; an empty one (a stray
/// comma) is refused, since it would otherwise match every tool.
pub(crate) fn deny_patterns(values: &[String]) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for value in values {
        for pattern in split_patterns(value) {
            anyhow::ensure!(
                !pattern.is_empty(),
                "empty --deny pattern in {value:?} (to deny every tool, write '.*')"
            );
            out.push(pattern.to_owned());
        }
    }
    Ok(out)
}

/// Whether the daemon behind `socket` answers and places this process in a session
/// (`peer_session` in its `/health`); false when there is no daemon (then the shim runs alone).
fn daemon_sees_a_session(socket: &std::path::Path) -> bool {
    // A thread of its own: the caller may already be inside a runtime.
    let socket = socket.to_path_buf();
    std::thread::spawn(move || ask_daemon_for_a_session(&socket))
        .join()
        .unwrap_or(false)
}

fn ask_daemon_for_a_session(socket: &std::path::Path) -> bool {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return false;
    };
    runtime.block_on(async {
        let ask = async {
            let api = crate::client::ApiClient::connect(socket).await?;
            let body = api.call(http::Method::GET, "/health", Vec::new()).await?;
            let health: serde_json::Value = serde_json::from_slice(&body)?;
            anyhow::Ok(health["peer_session"].is_string())
        };
        match tokio::time::timeout(std::time::Duration::from_secs(5), ask).await {
            Ok(Ok(inside)) => inside,
            Ok(Err(error)) => {
                tracing::debug!(%error, socket = %socket.display(), "no daemon answers; the shim runs on its own");
                false
            }
            Err(_) => {
                tracing::warn!(socket = %socket.display(), "the daemon did not answer within 5 s; the shim runs on its own");
                false
            }
        }
    })
}

/// The policy and, when recording, the event sink and its writer.
pub(crate) struct Enforcement {
    /// The gate every message is checked against.
    pub gate: Arc<dyn Gate>,
    /// Where events go (`None`: not recording).
    pub events: Option<EventSink>,
    /// Who calls an argument rule asks about are put to: the daemon on this host, over its
    /// socket (`approval.rs`); `None` when no rule asks.
    pub asker: Option<Asker>,
    /// The declared network servers: (id, URL).
    declared: Vec<(String, String)>,
    writer: Option<(JoinHandle<u64>, PathBuf)>,
}

/// The daemon of the session this process runs in, if it runs in one: the one `toolwall exec`
/// named (`TOOLWALL_API_SOCKET`), or — for agents that start their MCP servers with a
/// scrubbed environment (Codex CLI) — the configured one, when this process is in a session
/// cgroup or the daemon says it is (in its own cgroup namespace every cgroup reads `/`).
pub(crate) fn session_daemon(config: &Config) -> anyhow::Result<Option<PathBuf>> {
    if let Some(socket) = std::env::var_os("TOOLWALL_API_SOCKET") {
        return Ok(Some(PathBuf::from(socket)));
    }
    // The default socket directory is checked as for any client: a path another user could
    // have made must not be trusted to answer for the daemon.
    let socket = || crate::config::prepare_socket_dir(config.api.socket.as_deref(), false);
    if crate::cgroup::session_of("self").is_some() {
        return socket().map(Some);
    }
    if crate::cgroup::cgroup_path_of("self").as_deref() == Some("/") {
        let found = socket().ok().filter(|socket| daemon_sees_a_session(socket));
        static SAID: std::sync::Once = std::sync::Once::new();
        if found.is_none() {
            SAID.call_once(|| {
            // A session's agent sees its cgroup as `/` (its own cgroup namespace), and an MCP
            // client that passes servers only a few variables (the Python SDK's stdio client)
            // drops TOOLWALL_API_SOCKET: said, not silent.
            tracing::warn!(
                "no toolwall daemon answers on {} for this process; if it runs in a `toolwall exec` session whose daemon has another api.socket, pass `--config` with that daemon's file (or keep TOOLWALL_API_SOCKET in the server's environment) — until then this runs on its own, with this process's configuration",
                crate::config::socket_path(config.api.socket.as_deref()).display()
            );
            });
        }
        return Ok(found);
    }
    Ok(None)
}

impl Enforcement {
    /// Builds the policy from `config` (or the embedded default) and the `--deny` values;
    /// records into `db` (or, with only `--config`, its `store.path`) when either is given.
    /// Refused inside a session ([`session_daemon`]): the daemon judges and records there.
    pub(crate) fn new(
        config: Option<&std::path::Path>,
        db: Option<&std::path::Path>,
        deny: &[String],
    ) -> anyhow::Result<Self> {
        let patterns = deny_patterns(deny)?;
        let loaded = Config::load(config)?;
        if let Some(socket) = session_daemon(&loaded)? {
            anyhow::bail!(
                "this runs inside a toolwall session (daemon {}): what runs inside a session could forge its own audit, so it neither judges nor records there. Run `toolwall mcp-proxy` outside the session; `toolwall shim` inside one has the daemon run the server",
                socket.display()
            );
        }
        let db_path = match (db, config) {
            (Some(db), _) => Some(db.to_path_buf()),
            (None, Some(_)) => Some(loaded.store_path()),
            (None, None) => None,
        };
        let registry = match &db_path {
            Some(path) => Registry::open(path)
                .with_context(|| format!("open the tool registry in {}", path.display()))?,
            None => Registry::in_memory().context("create an in-memory tool registry")?,
        };
        let gate: Arc<dyn Gate> = Arc::new(Policy::new(&loaded, Arc::new(registry), &patterns)?);
        let (events, writer) = match db_path {
            Some(path) => {
                let store = Store::open(&path)?;
                let (sink, rx) = EventSink::channel();
                (Some(sink), Some((spawn_writer(store, rx), path)))
            }
            None => (None, None),
        };
        let asks = loaded
            .sandbox
            .mcp
            .argument_rules
            .iter()
            .any(|rule| rule.action == ArgumentAction::Ask);
        // Asked at call time, where a daemon that started later answers too.
        let asker = asks
            .then(|| crate::config::prepare_socket_dir(loaded.api.socket.as_deref(), false))
            .and_then(|socket| match socket {
                Ok(socket) => Some(Asker::Daemon(socket)),
                Err(error) => {
                    tracing::warn!("argument rules ask a person, and the daemon's socket is unusable ({error:#}): such calls are refused");
                    None
                }
            });
        let declared = loaded
            .sandbox
            .mcp
            .servers
            .iter()
            .filter_map(|s| Some((s.id.clone(), s.url.clone()?)))
            .collect();
        Ok(Enforcement {
            gate,
            events,
            asker,
            declared,
            writer,
        })
    }

    /// The id of the declared server at `url` (same scheme, user, host, port, path and query;
    /// host and scheme in any case, the default port written or not, a trailing `/` or not),
    /// which the filter proxy takes for its server id: the policy's rules for that server then
    /// apply to calls through the proxy, and its calls are recorded under the name the agents'
    /// are. An error when two declared servers are at that URL: which one's rules hold is not
    /// guessed.
    pub(crate) fn declared_server(&self, url: &str) -> anyhow::Result<Option<String>> {
        let Some(wanted) = crate::config::url_key(url) else {
            return Ok(None);
        };
        let found: Vec<&str> = self
            .declared
            .iter()
            .filter(|(_, declared)| crate::config::url_key(declared).as_ref() == Some(&wanted))
            .map(|(id, _)| id.as_str())
            .collect();
        match found.as_slice() {
            [] => Ok(None),
            [id] => Ok(Some(id.to_string())),
            ids => anyhow::bail!(
                "the upstream {url} is the URL of declared servers {}: pass --server-id to say which one this proxy serves",
                ids.join(", ")
            ),
        }
    }

    /// Whether the configuration declares any network server (then an upstream that is none of
    /// them is worth a warning).
    pub(crate) fn declares_network_servers(&self) -> bool {
        !self.declared.is_empty()
    }

    /// Runs `work` (the stand-alone shim or filter proxy) with this gate and event sink on a
    /// runtime of its own, then waits for every event it recorded to be stored. The runtime
    /// does not wait for its blocking threads (stdin may be parked in read(2)).
    pub(crate) fn run<T, F>(
        self,
        work: impl FnOnce(Arc<dyn Gate>, Option<EventSink>, Option<Asker>) -> F,
    ) -> anyhow::Result<T>
    where
        F: std::future::Future<Output = anyhow::Result<T>>,
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the async runtime")?;
        let result = runtime.block_on(work(
            self.gate.clone(),
            self.events.clone(),
            self.asker.clone(),
        ));
        runtime.shutdown_timeout(std::time::Duration::from_millis(100));
        self.finish();
        result
    }

    /// Waits until every recorded event is in the database (call after the last sink clone is
    /// gone, i.e. after the shim or proxy returned).
    fn finish(mut self) {
        self.events = None;
        if let Some((writer, path)) = self.writer.take() {
            match writer.join() {
                Ok(n) => tracing::debug!(events = n, db = %path.display(), "events stored"),
                Err(_) => {
                    tracing::error!(db = %path.display(), "the event writer panicked; some events may be lost")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::{CallQuery, CallStage};

    #[test]
    fn splits_on_top_level_commas_only() {
        assert_eq!(
            split_patterns("^file_.*$,.*_database$"),
            ["^file_.*$", ".*_database$"]
        );
        assert_eq!(
            split_patterns("a{1,3},[,]x,\\,y"),
            ["a{1,3}", "[,]x", "\\,y"]
        );
    }

    #[test]
    fn invalid_empty_and_oversized_patterns_are_refused() {
        let err = Enforcement::new(None, None, &["ok,(unclosed".into()])
            .err()
            .unwrap();
        assert!(
            format!("{err:#}").contains("--deny[1]") && format!("{err:#}").contains("(unclosed"),
            "{err:#}"
        );
        assert!(Enforcement::new(None, None, &["a,,b".into()]).is_err());
        assert!(Enforcement::new(None, None, &["(a{1000}){1000}".into()]).is_err());
    }

    #[test]
    fn denies_matching_names_through_the_policy() {
        let e = Enforcement::new(None, None, &["^echo$,^get-".into()]).unwrap();
        assert!(e.events.is_none(), "not recording without --config or --db");
        let call = |name| {
            e.gate.check_call(&CallQuery {
                server_id: Some("s"),
                name,
                namespace: None,
                stage: CallStage::Executing,
                arguments: None,
            })
        };
        assert!(call("echo").is_blocked());
        assert!(call("get-sum").is_blocked());
        assert!(!call("echoes").is_blocked());
        assert!(
            e.gate
                .check_listed("s", "stdio", &serde_json::json!({"name": "echo"}))
                .is_blocked()
        );
    }

    #[test]
    fn with_a_database_events_are_stored_by_the_time_finish_returns() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("events.db");
        let e = Enforcement::new(None, Some(&db), &[]).unwrap();
        let decision = e
            .gate
            .check_listed("s", "stdio", &serde_json::json!({"name": "echo"}));
        let sink = e.events.clone().unwrap();
        sink.emit(crate::events::Event::McpToolSeen(crate::events::ToolSeen {
            policy_revision: None,
            timestamp: chrono::Utc::now(),
            session_id: String::new(),
            server_id: "s".into(),
            server_type: "stdio".into(),
            tool_name: "echo".into(),
            tool_hash: decision.tool.map(|t| t.tool_hash).unwrap_or_default(),
            action: decision.action,
            reason: decision.reason,
        }));
        drop(sink);
        e.finish();
        assert_eq!(Store::open(&db).unwrap().count().unwrap(), 1);
        assert_eq!(
            Registry::open(&db).unwrap().tools().len(),
            1,
            "the listing is registered in the shared registry"
        );
    }

    /// The filter proxy records and judges a declared server's calls under its id: its URL
    /// written another way (case of scheme and host, default port, trailing slash) is the same
    /// server; another path, port, scheme, user or query is not; two servers at one URL are
    /// refused, not guessed between.
    #[test]
    fn a_declared_servers_url_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("toolwall.yaml");
        let servers = [
            ("tickets", "http://Tickets.local/mcp"),
            ("public", "http://reader@tickets.local/mcp?tenant=public"),
            ("admin", "http://admin@tickets.local/mcp?tenant=admin"),
            ("twin-a", "http://twin.local/mcp"),
            ("twin-b", "http://TWIN.local:80/mcp/"),
        ];
        let mut yaml = format!(
            "store:\n  path: {}\nsandbox:\n  mcp:\n    servers:\n",
            dir.path().join("events.db").display()
        );
        for (id, url) in servers {
            yaml += &format!("      - {{id: {id}, type: http, url: \"{url}\"}}\n");
        }
        std::fs::write(&config, yaml).unwrap();
        let e = Enforcement::new(Some(&config), None, &[]).unwrap();
        let id = |url: &str| e.declared_server(url).unwrap();
        for same in ["http://tickets.local/mcp", "HTTP://TICKETS.local:80/mcp/"] {
            assert_eq!(id(same).as_deref(), Some("tickets"), "{same}");
        }
        assert_eq!(
            id("http://admin@tickets.local/mcp?tenant=admin").as_deref(),
            Some("admin")
        );
        for other in [
            "http://tickets.local/other",
            "http://tickets.local:8080/mcp",
            "https://tickets.local/mcp",
            "http://tickets.local/mcp?tenant=admin",
            "http://admin@tickets.local/mcp?tenant=public",
            "not a url",
            // A port that is no 16-bit number is no URL, not the default port.
            "http://tickets.local:65616/mcp",
            "http://tickets.local:+80/mcp",
            "http://tickets.local:x/mcp",
        ] {
            assert_eq!(id(other), None, "{other}");
        }
        let twins = e.declared_server("http://twin.local/mcp").unwrap_err();
        assert!(
            twins.to_string().contains("twin-a, twin-b")
                || twins.to_string().contains("twin-b, twin-a"),
            "{twins}"
        );
        e.finish();
    }
}
