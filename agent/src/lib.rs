//! toolwall: decides which MCP tools an AI agent may call, enforces it before they run, and
//! records every call, at three layers (LLM interceptor, MCP shim/proxy, kernel connect hooks).
//!
//! The binary `toolwall` is a thin shell over [`main`]; everything else is the crate's own
//! (`pub(crate)`). What stays public is what the binary (`src/main.rs`), the end-to-end tests
//! (`tests/`, `agent/tests/`), the benchmarks ([`bench`]) and the fuzz targets ([`fuzzing`])
//! drive: the same code, through these doors only.

#![warn(unreachable_pub, missing_docs)]

mod approval;
mod cgroup;
mod cli;
mod client;
mod config;
mod correlate;
mod daemon;
mod decision;
mod demo;
mod edge;
mod events;
mod exec;
mod framing;
mod hidden;
mod listen;
mod llm;
mod mcp;
mod netmon;
mod policy;
mod registry;
mod seccomp;
mod sockdiag;
mod sse;
mod views;

pub use cgroup::{SessionCgroup, cgroup2_mount};
pub use cli::{Cli, main};
pub use decision::{
    Action, CallQuery, Decision, Gate, ResultAction, ResultFinding, ResultVerdict, ToolIdentity,
};
pub use events::{Event, EventSink};
pub use llm::{LlmProxy, LlmProxySettings};
pub use netmon::{
    KernelMonitor, Rule, RuleAction,
    events::{Connect, drain as drain_connects},
    pins::{PinDir, build_id},
};

/// What the benchmarks (`agent/benches/toolwall.rs`) drive besides the doors above; their
/// harnesses are built with the `bench` feature only, never into the shipped binary.
pub mod bench {
    pub use crate::correlate::Correlator;
    #[cfg(feature = "bench")]
    pub use crate::daemon::otlp::bench_export;
    pub use crate::events::{
        NetworkConnection, Store, StoredEvent, ToolCallIntercepted, ToolCalled, spawn_writer,
    };
    pub use crate::llm::Dialect;
    #[cfg(feature = "bench")]
    pub use crate::llm::bench::{
        bench_interceptor, bench_proxy_latency, bench_proxy_throughput, many_calls_stream,
        text_heavy_stream, time_many_calls, tool_heavy_stream,
    };
    #[cfg(feature = "bench")]
    pub use crate::policy::{
        ResultText, bench_argument_decisions, bench_decisions, bench_result_inspection,
        bench_rule_evaluation, result_message,
    };
    pub use crate::registry::value_hash;
    pub use crate::sse::framer::SseDecoder;
}

/// The oracles the fuzz targets (`agent/fuzz`) run; built with the `fuzzing` feature only.
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    pub use crate::llm::fuzzing::run as llm_sse;
    pub use crate::mcp::fuzzing::run as mcp_filter;
}
