//! Through the whole proxy on loopback: latency per event and throughput per path.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::BenchGate;
use super::streams::{mbps, text_heavy_stream, tool_heavy_stream};

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
    let settings = crate::llm::LlmProxySettings {
        listen: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
        anthropic_upstream: format!("http://{upstream}"),
        openai_upstream: format!("http://{upstream}"),
        gemini_upstream: format!("http://{upstream}"),
        // The copy baseline: a route relayed uninspected, as `proxy.pass_through` lists it.
        pass_through: vec![crate::config::PassThrough::parse(
            crate::config::Provider::Openai,
            "* /v1/files",
        )?],
        ..crate::llm::LlmProxySettings::default()
    };
    let (sink, mut rx) = crate::events::EventSink::channel();
    tokio::spawn(async move { while rx.recv().await.is_some() {} });
    let proxy = crate::llm::LlmProxy::bind(settings, Arc::new(BenchGate), sink).await?;
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
        // A `proxy.pass_through` route: the proxy copies it through untouched.
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
