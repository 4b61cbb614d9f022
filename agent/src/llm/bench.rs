//! Interceptor throughput, for `cargo xtask bench`.
//!
//! Lives in the library so the bench measures the same code the proxy runs, with no I/O: a
//! synthetic Anthropic stream is fed in 16 KiB reads (a typical TLS record batch) through the
//! interceptor, and the same bytes through a plain copy into a reused buffer; the ratio says
//! what inspection costs relative to forwarding.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;

use super::{Dialect, OnMalformed, StreamInterceptor};
use crate::decision::{Action, CallQuery, Decision, Gate};

/// One run's numbers (MB = 10^6 bytes).
#[derive(Debug, Clone, PartialEq)]
pub struct BenchReport {
    /// Plain copy of the text-heavy stream, MB/s.
    pub copy_text_mbps: f64,
    /// Interceptor on the text-heavy stream, MB/s.
    pub intercept_text_mbps: f64,
    /// Plain copy of the tool-heavy stream, MB/s.
    pub copy_tool_mbps: f64,
    /// Interceptor on the tool-heavy stream (half the calls blocked), MB/s.
    pub intercept_tool_mbps: f64,
}

impl BenchReport {
    /// Interceptor / copy on the text-heavy stream (goal: ≥ 0.8).
    pub fn text_ratio(&self) -> f64 {
        self.intercept_text_mbps / self.copy_text_mbps
    }

    /// Interceptor / copy on the tool-heavy stream.
    pub fn tool_ratio(&self) -> f64 {
        self.intercept_tool_mbps / self.copy_tool_mbps
    }
}

impl std::fmt::Display for BenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "anthropic text-heavy: intercept {:.0} MB/s, copy {:.0} MB/s, ratio {:.2}",
            self.intercept_text_mbps,
            self.copy_text_mbps,
            self.text_ratio()
        )?;
        write!(
            f,
            "anthropic tool-heavy: intercept {:.0} MB/s, copy {:.0} MB/s, ratio {:.2}",
            self.intercept_tool_mbps,
            self.copy_tool_mbps,
            self.tool_ratio()
        )
    }
}

/// Blocks every tool whose name ends in `_blocked`; all `mcp__` names are MCP tools.
struct BenchGate;

impl Gate for BenchGate {
    fn check_call(&self, call: &CallQuery<'_>) -> Decision {
        let action = if call.name.ends_with("_blocked") {
            Action::Block
        } else {
            Action::Allow
        };
        Decision {
            action,
            reason: "bench".into(),
            tool: None,
        }
    }

    fn check_listed(&self, _: &str, _: &str, _: &serde_json::Value) -> Decision {
        Decision::not_mcp()
    }
}

/// A text-heavy stream: one text block of many small deltas (what chat turns look like).
pub fn text_heavy_stream(target_bytes: usize) -> Vec<u8> {
    let mut s = String::from(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude\",\"stop_reason\":null,\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\nevent: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    );
    while s.len() < target_bytes {
        s.push_str("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"The quick brown fox jumps over the lazy dog, again and again. \"}}\n\n");
    }
    s.push_str("event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":99}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    s.into_bytes()
}

/// A tool-heavy stream: many tool_use blocks with streamed JSON input, every other one blocked.
pub fn tool_heavy_stream(target_bytes: usize) -> Vec<u8> {
    let mut s = String::from(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"claude\",\"stop_reason\":null,\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n",
    );
    let mut index = 0u64;
    while s.len() < target_bytes {
        let name = if index.is_multiple_of(2) {
            "mcp__fs__read_blocked"
        } else {
            "mcp__fs__read"
        };
        s.push_str(&format!("event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":{index},\"content_block\":{{\"type\":\"tool_use\",\"id\":\"toolu_{index}\",\"name\":\"{name}\",\"input\":{{}}}}}}\n\n"));
        for _ in 0..8 {
            s.push_str(&format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":{index},\"delta\":{{\"type\":\"input_json_delta\",\"partial_json\":\"{{\\\"path\\\": \\\"/tmp/some/file\\\"\"}}}}\n\n"));
        }
        s.push_str(&format!(
            "event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":{index}}}\n\n"
        ));
        index += 1;
    }
    s.push_str("event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":99}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    s.into_bytes()
}

const READ: usize = 16 * 1024;

fn mbps(bytes: usize, iters: u32, elapsed: Duration) -> f64 {
    (bytes as f64 * f64::from(iters)) / elapsed.as_secs_f64().max(1e-9) / 1e6
}

fn time_copy(stream: &[u8], iters: u32) -> f64 {
    let mut out = BytesMut::with_capacity(READ * 2);
    let start = Instant::now();
    for _ in 0..iters {
        for chunk in stream.chunks(READ) {
            out.extend_from_slice(black_box(chunk));
            black_box(&out);
            out.clear();
        }
    }
    mbps(stream.len(), iters, start.elapsed())
}

fn time_intercept(stream: &[u8], iters: u32) -> f64 {
    let gate: Arc<dyn Gate> = Arc::new(BenchGate);
    let mut out = BytesMut::with_capacity(READ * 2);
    let start = Instant::now();
    for _ in 0..iters {
        let mut i = StreamInterceptor::new(
            Dialect::Anthropic,
            gate.clone(),
            OnMalformed::FailClosed,
            16 << 20,
        );
        for chunk in stream.chunks(READ) {
            i.feed(black_box(chunk), &mut out);
            black_box(&out);
            out.clear();
            i.drain_records().for_each(drop);
        }
        i.finish(&mut out);
        out.clear();
    }
    mbps(stream.len(), iters, start.elapsed())
}

/// Measures the Anthropic interceptor against a plain copy on a text-heavy and a tool-heavy
/// stream of about `stream_bytes` each, `iters` passes per measurement (build with
/// `--release`; the numbers of a debug build mean little).
pub fn bench_interceptor(stream_bytes: usize, iters: u32) -> BenchReport {
    let text = text_heavy_stream(stream_bytes);
    let tool = tool_heavy_stream(stream_bytes);
    // Warm up caches and the allocator once.
    time_intercept(&text, 1);
    BenchReport {
        copy_text_mbps: time_copy(&text, iters),
        intercept_text_mbps: time_intercept(&text, iters),
        copy_tool_mbps: time_copy(&tool, iters),
        intercept_tool_mbps: time_intercept(&tool, iters),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::testing::data_values;

    #[test]
    fn bench_streams_are_valid_and_blocked_calls_leave() {
        let tool = tool_heavy_stream(20_000);
        let text = text_heavy_stream(20_000);
        assert!(!data_values(&tool).is_empty() && !data_values(&text).is_empty());
        let report = bench_interceptor(20_000, 2);
        assert!(report.text_ratio() > 0.0 && report.tool_ratio() > 0.0);
        let mut i = StreamInterceptor::new(
            Dialect::Anthropic,
            Arc::new(BenchGate),
            OnMalformed::FailClosed,
            1 << 20,
        );
        let mut out = BytesMut::new();
        i.feed(&tool, &mut out);
        i.finish(&mut out);
        let out = String::from_utf8_lossy(&out);
        assert!(!out.contains("\"name\":\"mcp__fs__read_blocked\""));
        assert!(out.contains("\"name\":\"mcp__fs__read\""));
    }

    /// `cargo test --release -p agent --lib llm::bench -- --ignored --nocapture` prints the
    /// numbers (a debug build's are meaningless, hence ignored by default).
    #[test]
    #[ignore = "timing; run in release"]
    fn print_bench() {
        let report = bench_interceptor(4 << 20, 20);
        println!("{report}");
    }
}
