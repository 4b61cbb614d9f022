//! In-memory numbers: synthetic streams and what the interceptor costs per byte on them.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::BenchGate;
use crate::decision::Gate;
use crate::llm::{Dialect, OnMalformed, Output, StreamInterceptor};

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
    /// Interceptor / in-memory copy on the text-heavy stream (the goal is judged through the
    /// proxy: [`ThroughputReport::text_ratio`]).
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

pub(super) fn mbps(bytes: usize, iters: u32, elapsed: Duration) -> f64 {
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
    // Reads as the proxy gets them: slices of buffers the network layer filled.
    let stream = Bytes::copy_from_slice(stream);
    let reads: Vec<Bytes> = (0..stream.len())
        .step_by(READ)
        .map(|at| stream.slice(at..(at + READ).min(stream.len())))
        .collect();
    let mut out = Output::default();
    let start = Instant::now();
    for _ in 0..iters {
        let mut i = StreamInterceptor::new(
            Dialect::Anthropic,
            gate.clone(),
            OnMalformed::FailClosed,
            16 << 20,
        );
        for read in &reads {
            i.feed(black_box(read.clone()), &mut out);
            out.drain().for_each(|b| drop(black_box(b)));
            i.drain_records().for_each(drop);
        }
        i.finish(&mut out);
        out.drain().for_each(drop);
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

/// A stream of `calls` tool calls in `dialect`, every other one blocked (named `…_blocked`),
/// each call in its own events as the APIs send them.
pub fn many_calls_stream(dialect: Dialect, calls: usize) -> Vec<u8> {
    let mut s = String::new();
    let name = |i: usize| {
        if i.is_multiple_of(2) {
            format!("mcp__fs__t{i}_blocked")
        } else {
            format!("mcp__fs__t{i}")
        }
    };
    match dialect {
        Dialect::Anthropic => {
            s.push_str("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"c\",\"stop_reason\":null,\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}}\n\n");
            for i in 0..calls {
                s.push_str(&format!("event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":{i},\"content_block\":{{\"type\":\"tool_use\",\"id\":\"t{i}\",\"name\":\"{}\",\"input\":{{}}}}}}\n\n", name(i)));
                s.push_str(&format!("event: content_block_delta\ndata: {{\"type\":\"content_block_delta\",\"index\":{i},\"delta\":{{\"type\":\"input_json_delta\",\"partial_json\":\"{{}}\"}}}}\n\n"));
                s.push_str(&format!("event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":{i}}}\n\n"));
            }
        }
        Dialect::OpenAiChat => {
            for i in 0..calls {
                s.push_str(&format!("data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[{{\"index\":{i},\"id\":\"call_{i}\",\"type\":\"function\",\"function\":{{\"name\":\"{}\",\"arguments\":\"\"}}}}]}},\"finish_reason\":null}}]}}\n\n", name(i)));
                s.push_str(&format!("data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"tool_calls\":[{{\"index\":{i},\"function\":{{\"arguments\":\"{{}}\"}}}}]}},\"finish_reason\":null}}]}}\n\n"));
            }
            s.push_str("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\ndata: [DONE]\n\n");
        }
        Dialect::OpenAiResponses => {
            for i in 0..calls {
                let item = |status: &str, args: &str| {
                    format!(
                        "{{\"type\":\"function_call\",\"id\":\"fc_{i}\",\"call_id\":\"call_{i}\",\"name\":\"{}\",\"arguments\":\"{args}\",\"status\":\"{status}\"}}",
                        name(i)
                    )
                };
                s.push_str(&format!("event: response.output_item.added\ndata: {{\"type\":\"response.output_item.added\",\"output_index\":{i},\"item\":{}}}\n\n", item("in_progress", "")));
                s.push_str(&format!("event: response.function_call_arguments.delta\ndata: {{\"type\":\"response.function_call_arguments.delta\",\"output_index\":{i},\"item_id\":\"fc_{i}\",\"delta\":\"{{}}\"}}\n\n"));
                s.push_str(&format!("event: response.output_item.done\ndata: {{\"type\":\"response.output_item.done\",\"output_index\":{i},\"item\":{}}}\n\n", item("completed", "{}")));
            }
        }
        Dialect::Gemini => {
            for i in 0..calls {
                s.push_str(&format!("data: {{\"candidates\":[{{\"content\":{{\"parts\":[{{\"functionCall\":{{\"name\":\"{}\",\"args\":{{}}}}}}],\"role\":\"model\"}},\"index\":0}}],\"modelVersion\":\"g\"}}\r\n\r\n", name(i)));
            }
            s.push_str("data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"\"}],\"role\":\"model\"},\"finishReason\":\"STOP\",\"index\":0}],\"modelVersion\":\"g\"}\r\n\r\n");
        }
    }
    s.into_bytes()
}

/// Seconds to intercept `stream` once, in 16 KiB reads.
pub fn time_many_calls(dialect: Dialect, stream: &[u8]) -> f64 {
    let start = Instant::now();
    let mut i = StreamInterceptor::new(
        dialect,
        Arc::new(BenchGate),
        OnMalformed::FailClosed,
        64 << 20,
    );
    let mut out = Output::default();
    for piece in stream.chunks(16 * 1024) {
        i.feed(Bytes::copy_from_slice(piece), &mut out);
        out.drain().for_each(|b| {
            black_box(b);
        });
        i.drain_records().for_each(drop);
    }
    i.finish(&mut out);
    black_box(out.take_all());
    start.elapsed().as_secs_f64()
}
