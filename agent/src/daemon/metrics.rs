//! `GET /metrics`: the daemon's counters in the Prometheus/OpenMetrics text format,
//! through the maintained `prometheus-client` crate. Decisions are counted from the events the
//! store committed (the live feed every view follows: `daemon/mod.rs`), so a metric and the
//! record agree and no layer does more work per call; gauges are read when scraped.
//!
//! Label values come from servers and agents (tool names): at most [`MAX_LABEL_SETS`]
//! decision series are kept, the rest are counted under `tool="(other)"`, `server="(other)"` —
//! a server listing a million names must not grow the daemon.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::DaemonState;
use crate::events::{Event, StoredEvent};

/// Distinct (layer, server, tool, decision) series kept; more share one `(other)` series.
const MAX_LABEL_SETS: usize = 4096;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DecisionLabels {
    layer: String,
    server: String,
    tool: String,
    decision: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TypeLabels {
    r#type: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CounterLabels {
    counter: String,
}

/// Longest label value kept (characters); a longer one is cut and marked with `…`.
const MAX_LABEL: usize = 128;

/// A name a server or agent chose, as an OpenMetrics label value: `prometheus-client` writes
/// label values as they are, so a tool named `x"} 1\n…` would forge series or break the
/// scrape — `\`, `"` and line ends are escaped here, and the value is bounded.
fn label(value: &str) -> String {
    let mut out = String::with_capacity(value.len().min(MAX_LABEL) + 8);
    for (i, c) in value.chars().enumerate() {
        if i == MAX_LABEL {
            out.push('…');
            break;
        }
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            // Other escapes are not OpenMetrics: a control character is shown as U+FFFD.
            c if c.is_control() => out.push(char::REPLACEMENT_CHARACTER),
            c => out.push(c),
        }
    }
    out
}

/// The daemon's metrics.
pub(crate) struct Metrics {
    registry: Registry,
    decisions: Family<DecisionLabels, Counter>,
    seen: Mutex<HashSet<DecisionLabels>>,
    events: Family<TypeLabels, Counter>,
    unreadable: Counter,
    queued_bytes: Gauge,
    store_writing: Gauge,
    sessions: Gauge,
    approvals_waiting: Gauge,
    kernel: Family<CounterLabels, Gauge>,
    export: Family<CounterLabels, Gauge>,
    bundle: Family<CounterLabels, Gauge>,
    /// The last committed row id (the export lag is measured from it).
    last_id: std::sync::atomic::AtomicI64,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// The daemon's metrics, with the LLM proxy's (when it runs) and the store's registered.
    pub(crate) fn new(
        llm: Option<&crate::llm::RelayStats>,
        store: &crate::events::StoreHealth,
    ) -> Arc<Self> {
        let mut registry = Registry::with_prefix("toolwall");
        registry.register(
            "store_commit_seconds",
            "Seconds each batch of events took to commit to the store",
            store.commit_seconds.clone(),
        );
        if let Some(llm) = llm {
            registry.register(
                "llm_streams_open",
                "LLM proxy response bodies open now",
                llm.open.clone(),
            );
            registry.register(
                "llm_bytes",
                "Bytes of response bodies the LLM proxy wrote to agents",
                llm.bytes.clone(),
            );
            registry.register(
                "llm_frame_seconds",
                "Seconds the LLM proxy spent on each frame it wrote (reading what upstream had ready, inspecting, rewriting): what it adds to a stream",
                llm.frame_seconds.clone(),
            );
        }
        let decisions = Family::<DecisionLabels, Counter>::default();
        registry.register(
            "decisions",
            "Tool calls and connections decided, by layer (llm, shim, mcp-proxy, kernel), server, tool and decision (allow, block)",
            decisions.clone(),
        );
        let events = Family::<TypeLabels, Counter>::default();
        registry.register(
            "events_stored",
            "Events the store committed, by type, whichever process wrote them (the daemon, a stand-alone shim or filter proxy)",
            events.clone(),
        );
        let unreadable = Counter::default();
        registry.register(
            "store_unreadable_rows",
            "Committed rows this daemon could not decode (shown as unreadable_row records)",
            unreadable.clone(),
        );
        let queued_bytes = Gauge::default();
        registry.register(
            "event_queue_bytes",
            "Bytes of events waiting for the store's writer (past its bound, layers wait)",
            queued_bytes.clone(),
        );
        let store_writing = Gauge::default();
        registry.register(
            "store_writing",
            "1 while the event store commits, 0 while it fails (full or read-only disk)",
            store_writing.clone(),
        );
        let sessions = Gauge::default();
        registry.register("sessions_open", "Agent sessions open", sessions.clone());
        let approvals_waiting = Gauge::default();
        registry.register(
            "approvals_waiting",
            "Calls waiting for a person (argument rules with action: ask)",
            approvals_waiting.clone(),
        );
        let kernel = Family::<CounterLabels, Gauge>::default();
        registry.register(
            "kernel",
            "The kernel layer's counters since the daemon started (connects, unmatched, flagged, denied, ring_drops, summarised, egress_drops, binds, own_port)",
            kernel.clone(),
        );
        let export = Family::<CounterLabels, Gauge>::default();
        registry.register(
            "otlp_export",
            "The OTLP exporter (telemetry.otlp): logs and spans the collector took, failed attempts, unlinked (call events sent without their span ids: too many waited), lag_events (events stored but not yet taken)",
            export.clone(),
        );
        let bundle = Family::<CounterLabels, Gauge>::default();
        registry.register(
            "policy_bundle",
            "Signed policy bundles (policy.bundle): revision in force (0: the local file's policy), applied and refused since start",
            bundle.clone(),
        );
        Arc::new(Metrics {
            registry,
            decisions,
            seen: Mutex::default(),
            events,
            unreadable,
            queued_bytes,
            store_writing,
            sessions,
            approvals_waiting,
            kernel,
            export,
            bundle,
            last_id: std::sync::atomic::AtomicI64::new(0),
        })
    }

    /// Counts one committed event.
    fn count(&self, event: &Event) {
        self.events
            .get_or_create(&TypeLabels {
                r#type: event.kind().to_owned(),
            })
            .inc();
        let (layer, tool, n) = match event {
            Event::McpToolCallIntercepted(e) => (
                "llm",
                match e.server_tool.as_str() {
                    "" => e.tool_name.as_str(),
                    tool => tool,
                },
                1,
            ),
            Event::McpToolCalled(e) => (e.layer.as_str(), e.tool_name.as_str(), 1),
            // A summary row stands for `count` connections.
            Event::McpNetworkConnection(e) => ("kernel", "", e.count.max(1)),
            _ => return,
        };
        // The layer of a posted event is the poster's word: only the layers there are count.
        let layer = match layer {
            "llm" | "shim" | "mcp-proxy" | "kernel" => layer,
            _ => "(other)",
        };
        let n = n.min(u64::from(u32::MAX));
        let keys = event.keys();
        let mut labels = DecisionLabels {
            layer: layer.to_owned(),
            server: label(keys.server),
            tool: label(tool),
            decision: keys.action.as_str().to_owned(),
        };
        {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            if !seen.contains(&labels) {
                if seen.len() >= MAX_LABEL_SETS {
                    labels.server = "(other)".into();
                    labels.tool = "(other)".into();
                } else {
                    seen.insert(labels.clone());
                }
            }
        }
        self.decisions.get_or_create(&labels).inc_by(n);
    }

    /// Counts one row the store committed, whichever process wrote it (`daemon/feed.rs` reads
    /// each once, in row order).
    pub(crate) fn committed(&self, stored: &StoredEvent) {
        self.last_id
            .fetch_max(stored.id, std::sync::atomic::Ordering::Relaxed);
        if let Event::UnreadableRow(_) = stored.event {
            self.unreadable.inc();
        }
        self.count(&stored.event);
    }

    /// The text a scrape gets (OpenMetrics), gauges read now.
    pub(crate) fn render(&self, state: &DaemonState) -> Result<String, std::fmt::Error> {
        self.queued_bytes
            .set(i64::try_from(state.sink.queued()).unwrap_or(i64::MAX));
        self.store_writing
            .set(i64::from(state.committer.health().failing().is_none()));
        self.sessions
            .set(i64::try_from(state.session_names().len()).unwrap_or(i64::MAX));
        self.approvals_waiting
            .set(i64::try_from(state.approvals.pending().len()).unwrap_or(i64::MAX));
        if let Some(c) = state.netmon.as_ref().and_then(|n| n.counters().ok()) {
            for (name, value) in [
                ("connects", c.connects),
                ("unmatched", c.unmatched),
                ("flagged", c.flagged),
                ("denied", c.denied),
                ("ring_drops", c.ring_drops),
                ("summarised", c.summarised),
                ("egress_drops", c.egress_drops),
                ("binds", c.binds),
                ("own_port", c.own_port),
            ] {
                self.kernel
                    .get_or_create(&CounterLabels {
                        counter: name.to_owned(),
                    })
                    .set(i64::try_from(value).unwrap_or(i64::MAX));
            }
        }
        if let Some(export) = &state.export {
            use std::sync::atomic::Ordering::Relaxed;
            let cursor = export.cursor.load(Relaxed);
            let lag = self.last_id.load(Relaxed).saturating_sub(cursor).max(0);
            let count = |n: &std::sync::atomic::AtomicU64| {
                i64::try_from(n.load(Relaxed)).unwrap_or(i64::MAX)
            };
            for (name, value) in [
                ("logs", count(&export.logs)),
                ("spans", count(&export.spans)),
                ("failures", count(&export.failures)),
                ("unlinked", count(&export.unlinked)),
                ("lag_events", lag),
            ] {
                self.export
                    .get_or_create(&CounterLabels {
                        counter: name.to_owned(),
                    })
                    .set(value);
            }
        }
        if let Some(bundle) = &state.bundle {
            let status = bundle.lock().unwrap_or_else(|e| e.into_inner()).clone();
            for (name, value) in [
                ("revision", status.revision.unwrap_or(0)),
                ("applied", status.applied),
                ("refused", status.refused),
            ] {
                self.bundle
                    .get_or_create(&CounterLabels {
                        counter: name.to_owned(),
                    })
                    .set(i64::try_from(value).unwrap_or(i64::MAX));
            }
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Action;

    fn called(tool: String, action: Action) -> Event {
        crate::events::test_call(&tool, None, action, String::new())
    }

    fn text(m: &Metrics) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &m.registry).unwrap();
        out
    }

    #[test]
    fn a_tool_name_cannot_forge_a_series_or_break_the_scrape() {
        let m = Metrics::new(None, &crate::events::StoreHealth::default());
        m.count(&called(
            "x\",decision=\"allow\"} 1\ntoolwall_decisions_total{tool=\"y\\".into(),
            Action::Block,
        ));
        let out = text(&m);
        let lines: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("toolwall_decisions_total"))
            .collect();
        assert_eq!(lines.len(), 1, "{out}");
        assert!(
            lines[0].ends_with(r#"tool="x\",decision=\"allow\"} 1\ntoolwall_decisions_total{tool=\"y\\",decision="block"} 1"#),
            "{}",
            lines[0]
        );
        assert_eq!(label(&"a".repeat(500)).chars().count(), MAX_LABEL + 1);
    }

    #[test]
    fn the_proxys_bodies_and_the_stores_commits_are_shown() {
        let llm = crate::llm::RelayStats::default();
        let store = crate::events::StoreHealth::default();
        let m = Metrics::new(Some(&llm), &store);
        llm.open.inc();
        llm.bytes.inc_by(300);
        llm.frame_seconds.observe(3e-6);
        store.commit_seconds.observe(2e-3);
        let out = text(&m);
        for line in [
            "toolwall_llm_streams_open 1",
            "toolwall_llm_bytes_total 300",
            "toolwall_llm_frame_seconds_count 1",
            r#"toolwall_llm_frame_seconds_bucket{le="0.000004"} 1"#,
            "toolwall_store_commit_seconds_count 1",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} in\n{out}");
        }
    }

    #[test]
    fn decisions_are_counted_and_their_series_bounded() {
        let m = Metrics::new(None, &crate::events::StoreHealth::default());
        m.count(&called("echo".into(), Action::Allow));
        m.count(&called("echo".into(), Action::Allow));
        m.count(&called("rm".into(), Action::Block));
        let out = text(&m);
        assert!(
            out.contains(r#"toolwall_decisions_total{layer="shim",server="srv",tool="echo",decision="allow"} 2"#),
            "{out}"
        );
        assert!(
            out.contains(r#"toolwall_events_stored_total{type="mcp_tool_called"} 3"#),
            "{out}"
        );
        // A server naming a tool per call cannot grow the series past the bound.
        for i in 0..MAX_LABEL_SETS + 100 {
            m.count(&called(format!("t{i}"), Action::Allow));
        }
        let out = text(&m);
        let series = out
            .lines()
            .filter(|l| l.starts_with("toolwall_decisions_total{"))
            .count();
        assert_eq!(series, MAX_LABEL_SETS + 1, "the bound plus (other)");
        assert!(
            out.contains(r#"toolwall_decisions_total{layer="shim",server="(other)",tool="(other)",decision="allow"} 102"#),
            "{}",
            out.lines().filter(|l| l.contains("(other)")).collect::<Vec<_>>().join("\n")
        );
    }
}
