//! Interceptor throughput and proxy latency, for `cargo xtask bench`.
//!
//! In memory (no I/O, [`bench_interceptor`]): a synthetic Anthropic stream fed in 16 KiB reads
//! through the interceptor, against an in-cache copy of the same bytes — what inspection costs
//! per byte. Measured on the shared 2-core dev machine: text-heavy 7–12 GB/s (runs of events
//! with no tool key are forwarded after one key scan, unframed), tool-heavy 0.3 GB/s, memcpy
//! ~30–40 GB/s.
//!
//! Through the whole proxy on loopback ([`bench_proxy_throughput`], [`bench_proxy_latency`]):
//! inspected text-heavy at 0.8–0.9x of the same proxy's plain copy of an uninspected path;
//! per event +15–35 µs at p50.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::{Dialect, OnMalformed, Output, StreamInterceptor};
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

/// Latency through the whole proxy on loopback, against the same exchange without it.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyReport {
    /// Events measured per path.
    pub events: usize,
    /// Per-event delivery time (upstream write → client read), direct, p50 and p99, µs.
    pub direct_event_us: (f64, f64),
    /// The same through the proxy.
    pub proxied_event_us: (f64, f64),
    /// Request sent → first body byte, direct, p50 and p99 over the runs, µs.
    pub direct_ttfb_us: (f64, f64),
    /// The same through the proxy.
    pub proxied_ttfb_us: (f64, f64),
}

impl LatencyReport {
    /// Added per event by the proxy at p50 (goal: < 50 µs).
    pub fn added_event_p50_us(&self) -> f64 {
        self.proxied_event_us.0 - self.direct_event_us.0
    }
}

impl std::fmt::Display for LatencyReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "per event ({} events): direct p50 {:.0} µs p99 {:.0} µs; proxied p50 {:.0} µs p99 {:.0} µs; added p50 {:.0} µs",
            self.events,
            self.direct_event_us.0,
            self.direct_event_us.1,
            self.proxied_event_us.0,
            self.proxied_event_us.1,
            self.added_event_p50_us()
        )?;
        write!(
            f,
            "first byte: direct p50 {:.0} µs p99 {:.0} µs; proxied p50 {:.0} µs p99 {:.0} µs",
            self.direct_ttfb_us.0,
            self.direct_ttfb_us.1,
            self.proxied_ttfb_us.0,
            self.proxied_ttfb_us.1
        )
    }
}

fn percentiles(mut v: Vec<f64>) -> (f64, f64) {
    if v.is_empty() {
        return (0.0, 0.0);
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

/// A loopback upstream that answers each request with an SSE stream of `events` text deltas,
/// writing event `i + 1` only after the client acknowledged event `i` (so each measurement is
/// one event's trip, never a batch), and reporting when it wrote each one.
async fn paced_upstream(
    events: usize,
) -> anyhow::Result<(
    std::net::SocketAddr,
    tokio::sync::mpsc::UnboundedReceiver<Instant>,
    tokio::sync::mpsc::UnboundedSender<()>,
)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (sent_tx, sent_rx) = tokio::sync::mpsc::unbounded_channel();
    let (ack_tx, mut ack_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let event = b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"The quick brown fox jumps over the lazy dog. \"}}\n\n";
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let mut buf = vec![0u8; 16 * 1024];
            let mut seen = Vec::new();
            loop {
                match sock.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
                if memchr::memmem::find(&seen, b"\r\n\r\n").is_some() {
                    break;
                }
            }
            let head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n";
            let _ = sock.write_all(head).await;
            for _ in 0..events {
                let chunk = [format!("{:x}\r\n", event.len()).as_bytes(), event, b"\r\n"].concat();
                let _ = sent_tx.send(Instant::now());
                if sock.write_all(&chunk).await.is_err() {
                    return;
                }
                if ack_rx.recv().await.is_none() {
                    return;
                }
            }
            let _ = sock.write_all(b"0\r\n\r\n").await;
        }
    });
    Ok((addr, sent_rx, ack_tx))
}

/// One request to `base`: first-byte time and per-event delivery times.
async fn measure(
    base: std::net::SocketAddr,
    sent: &mut tokio::sync::mpsc::UnboundedReceiver<Instant>,
    ack: &tokio::sync::mpsc::UnboundedSender<()>,
    per_event: &mut Vec<f64>,
) -> anyhow::Result<f64> {
    use http_body_util::{BodyExt, Full};
    let client: hyper_util::client::legacy::Client<_, Full<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let req = hyper::Request::post(format!("http://{base}/v1/messages"))
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from_static(b"{\"stream\":true}")))?;
    let start = Instant::now();
    let resp = client.request(req).await?;
    let mut body = resp.into_body();
    let mut ttfb = None;
    let mut pending = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame?;
        let Some(data) = frame.data_ref() else {
            continue;
        };
        let now = Instant::now();
        ttfb.get_or_insert_with(|| now.duration_since(start));
        pending += memchr::memmem::find_iter(data, b"\n\n").count();
        while pending > 0 {
            pending -= 1;
            if let Ok(at) = sent.try_recv() {
                per_event.push(now.duration_since(at).as_secs_f64() * 1e6);
            }
            let _ = ack.send(());
        }
    }
    Ok(ttfb.unwrap_or_default().as_secs_f64() * 1e6)
}

/// The proxy in front of `upstream` for both providers, with the bench gate; it runs until the
/// returned sender is used or dropped.
async fn start_proxy(
    upstream: std::net::SocketAddr,
) -> anyhow::Result<(std::net::SocketAddr, tokio::sync::oneshot::Sender<()>)> {
    let settings = super::LlmProxySettings {
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        anthropic_upstream: format!("http://{upstream}"),
        openai_upstream: format!("http://{upstream}"),
        ..super::LlmProxySettings::default()
    };
    let (sink, mut rx) = crate::events::EventSink::channel();
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let proxy = super::LlmProxy::bind(settings, Arc::new(BenchGate), sink).await?;
    let proxy_addr = proxy.local_addr()?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(proxy.run(async {
        let _ = stop_rx.await;
    }));
    Ok((proxy_addr, stop_tx))
}

/// Measures per-event latency and time to first byte through the whole proxy on loopback
/// (fake upstream, `runs` requests of `events` events), against the same upstream direct.
pub async fn bench_proxy_latency(runs: usize, events: usize) -> anyhow::Result<LatencyReport> {
    let (upstream, mut sent, ack) = paced_upstream(events).await?;
    let (proxy_addr, stop_tx) = start_proxy(upstream).await?;
    let (mut direct_ev, mut proxied_ev) = (Vec::new(), Vec::new());
    let (mut direct_ttfb, mut proxied_ttfb) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        direct_ttfb.push(measure(upstream, &mut sent, &ack, &mut direct_ev).await?);
        proxied_ttfb.push(measure(proxy_addr, &mut sent, &ack, &mut proxied_ev).await?);
    }
    let _ = stop_tx.send(());
    Ok(LatencyReport {
        events: direct_ev.len().min(proxied_ev.len()),
        direct_event_us: percentiles(direct_ev),
        proxied_event_us: percentiles(proxied_ev),
        direct_ttfb_us: percentiles(direct_ttfb),
        proxied_ttfb_us: percentiles(proxied_ttfb),
    })
}

/// Stream throughput through the whole proxy on loopback, MB/s (medians over the runs).
#[derive(Debug, Clone, PartialEq)]
pub struct ThroughputReport {
    /// Bytes per response.
    pub bytes: usize,
    /// Client reading the upstream directly.
    pub direct_mbps: f64,
    /// Through the proxy on a path it passes through uninspected: a plain copy of the bytes
    /// by the same proxy, the baseline inspection is measured against.
    pub copy_mbps: f64,
    /// Through the proxy on `/v1/messages`, the text-heavy stream inspected.
    pub text_mbps: f64,
    /// Through the proxy on `/v1/messages`, the tool-heavy stream inspected (half blocked).
    pub tool_mbps: f64,
    /// Inspected text-heavy / plain copy, per round (the two measured back to back, so a
    /// machine whose load drifts between rounds weighs on both alike), sorted.
    pub text_ratios: Vec<f64>,
}

impl ThroughputReport {
    /// The median of the per-round ratios of inspected text-heavy to plain copy (goal: ≥ 0.8).
    pub fn text_ratio(&self) -> f64 {
        self.text_ratios
            .get(self.text_ratios.len() / 2)
            .copied()
            .unwrap_or(0.0)
    }
}

/// A loopback upstream answering every request with `text` on `/v1/messages?text`, `tool` on
/// `/v1/messages?tool` and `text` on any other path, as fast as the socket takes it.
async fn bulk_upstream(text: Bytes, tool: Bytes) -> anyhow::Result<std::net::SocketAddr> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let (text, tool) = (text.clone(), tool.clone());
            tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                let head_end = loop {
                    match sock.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => seen.extend_from_slice(&buf[..n]),
                    }
                    if let Some(p) = memchr::memmem::find(&seen, b"\r\n\r\n") {
                        break p;
                    }
                };
                let body = if memchr::memmem::find(&seen[..head_end], b"?tool").is_some() {
                    tool
                } else {
                    text
                };
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                if sock.write_all(head.as_bytes()).await.is_ok() {
                    let _ = sock.write_all(&body).await;
                }
            });
        }
    });
    Ok(addr)
}

/// Reads one whole response from `url`; MB/s of the `expect` bytes upstream sent, from request
/// to last byte. `exact`: the response must be those bytes' length (nothing was blocked).
async fn read_all(url: &str, expect: usize, exact: bool) -> anyhow::Result<f64> {
    use http_body_util::{BodyExt, Full};
    let client: hyper_util::client::legacy::Client<_, Full<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let req = hyper::Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from_static(b"{\"stream\":true}")))?;
    let start = Instant::now();
    let mut body = client.request(req).await?.into_body();
    let mut n = 0;
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame?.data_ref() {
            n += data.len();
        }
    }
    let elapsed = start.elapsed();
    anyhow::ensure!(
        n > 0 && (!exact || n == expect),
        "read {n} of {expect} bytes from {url}"
    );
    Ok(mbps(expect, 1, elapsed))
}

fn median_of(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Measures stream throughput through the whole proxy on loopback: `runs` responses of about
/// `stream_bytes` per path, the paths taking turns so a noisy machine weighs on all alike.
pub async fn bench_proxy_throughput(
    stream_bytes: usize,
    runs: usize,
) -> anyhow::Result<ThroughputReport> {
    let text = Bytes::from(text_heavy_stream(stream_bytes));
    let tool = Bytes::from(tool_heavy_stream(stream_bytes));
    let (text_len, tool_len) = (text.len(), tool.len());
    let upstream = bulk_upstream(text, tool).await?;
    let (proxy_addr, stop_tx) = start_proxy(upstream).await?;
    // The tool-heavy stream shrinks where calls are blocked; the others arrive whole.
    let paths = [
        (
            format!("http://{upstream}/v1/messages?text"),
            text_len,
            true,
        ),
        // Not an inspected path: the proxy copies it through untouched.
        (format!("http://{proxy_addr}/v1/files?text"), text_len, true),
        (
            format!("http://{proxy_addr}/v1/messages?text"),
            text_len,
            true,
        ),
        (
            format!("http://{proxy_addr}/v1/messages?tool"),
            tool_len,
            false,
        ),
    ];
    let mut results = vec![Vec::new(); paths.len()];
    for (url, len, exact) in &paths {
        read_all(url, *len, *exact).await?; // warm-up
    }
    for _ in 0..runs {
        for (i, (url, len, exact)) in paths.iter().enumerate() {
            results[i].push(read_all(url, *len, *exact).await?);
        }
    }
    let _ = stop_tx.send(());
    let mut text_ratios: Vec<f64> = results[2]
        .iter()
        .zip(&results[1])
        .map(|(text, copy)| text / copy)
        .collect();
    text_ratios.sort_by(f64::total_cmp);
    let mut medians = results.into_iter().map(median_of);
    let mut next = || medians.next().unwrap_or(0.0);
    Ok(ThroughputReport {
        bytes: text_len,
        direct_mbps: next(),
        copy_mbps: next(),
        text_mbps: next(),
        tool_mbps: next(),
        text_ratios,
    })
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
        let mut out = Output::default();
        i.feed(Bytes::copy_from_slice(&tool), &mut out);
        i.finish(&mut out);
        let out = out.take_all();
        let out = String::from_utf8_lossy(&out);
        assert!(!out.contains("\"name\":\"mcp__fs__read_blocked\""));
        assert!(out.contains("\"name\":\"mcp__fs__read\""));
    }

    #[tokio::test]
    async fn throughput_bench_reads_every_path_whole() {
        let report = bench_proxy_throughput(200_000, 1)
            .await
            .expect("bench runs");
        assert!(report.bytes >= 200_000);
        for mbps in [
            report.direct_mbps,
            report.copy_mbps,
            report.text_mbps,
            report.tool_mbps,
        ] {
            assert!(mbps > 0.0, "{report:?}");
        }
    }

    #[tokio::test]
    async fn latency_bench_measures_every_event() {
        let report = bench_proxy_latency(2, 20).await.expect("bench runs");
        assert_eq!(report.events, 40);
        assert!(report.proxied_event_us.0 > 0.0 && report.direct_ttfb_us.0 > 0.0);
    }
}
