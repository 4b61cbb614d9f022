//! `cargo xtask bench`: every number is printed next to a baseline measured in the same run, and
//! as a ratio, because absolute times on a shared 2-core machine say little.
//!
//! Run one group with `cargo bench -p agent --bench toolwall -- GROUP` (connect, store,
//! correlate, export, policy, policy-results, interceptor, llm-throughput, llm-latency,
//! mcp-latency, views). The larger groups have modules of their own: `connect.rs` (the kernel
//! layer's programs, attached in this process), `llm.rs` (the LLM proxy, also as a relay next
//! to nginx: `relay.rs`), `mcp.rs` and `views.rs`; `procs.rs` starts the processes they drive. `mcp-latency` drives the release binary (`TOOLWALL_BIN`, default
//! `target/release/toolwall`) and the peers `cargo xtask peers` installs (`TOOLWALL_PEERS_DIR`,
//! default `target/peers`); `cargo xtask bench` sets both up.

use std::{
    hint::black_box,
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use bytes::BytesMut;

mod connect;
mod hyper_relay;
mod llm;
mod mcp;
mod procs;
mod relay;
mod views;

use connect::bench_connect;
use llm::{bench_llm_latency, bench_llm_throughput, bench_relay_latency, bench_relay_throughput};
use mcp::bench_mcp_latency;
use procs::{Proc, free_port, start_daemon, start_listening, toolwall_bin};

use toolwall::{
    Action, Event, KernelMonitor, Rule, RuleAction, SessionCgroup,
    bench::{NetworkConnection, Store, StoredEvent, ToolCallIntercepted, ToolCalled},
    cgroup2_mount,
};

fn main() {
    hyper_relay::serve_if_asked();
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let wanted = |name: &str| filter.is_empty() || filter.iter().any(|f| name.contains(f.as_str()));
    if wanted("connect") {
        bench_connect();
    }
    if wanted("store") {
        bench_store();
    }
    if wanted("correlate") {
        bench_correlate();
    }
    if wanted("export") {
        bench_export();
    }
    if wanted("policy") {
        bench_policy();
    }
    if wanted("policy-results") {
        bench_results();
    }
    if wanted("interceptor") {
        bench_interceptor();
    }
    if wanted("llm-throughput") {
        bench_llm_throughput();
        bench_relay_throughput();
    }
    if wanted("llm-latency") {
        bench_llm_latency();
        bench_relay_latency();
    }
    if wanted("mcp-latency") {
        bench_mcp_latency();
    }
    if wanted("views") {
        views::bench_views();
    }
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn percentile(mut samples: Vec<Duration>, p: f64) -> Duration {
    samples.sort();
    samples[((samples.len() as f64 - 1.0) * p) as usize]
}

fn event(i: usize) -> Event {
    Event::McpToolCalled(ToolCalled {
        policy_revision: None,
        timestamp: chrono::Utc::now(),
        session_id: "bench".into(),
        server_id: "everything".into(),
        server_type: "stdio".into(),
        tool_name: format!("tool{}", i % 50),
        jsonrpc_id: serde_json::json!(i),
        input: Some(serde_json::json!({"message": "hello", "n": i})),
        action: Action::Allow,
        reason: String::new(),
        layer: "shim".into(),
    })
}

/// Events per second into SQLite: batched (the writer's way) vs one transaction per event.
/// Goal: over 50,000 events/s batched.
fn bench_store() {
    println!("== event store: events per second into SQLite (WAL)");
    let dir = tempfile::tempdir().unwrap();
    let per_event_n = 2_000;
    let mut store = Store::open(&dir.path().join("single.db")).unwrap();
    let events: Vec<Event> = (0..per_event_n).map(event).collect();
    let start = Instant::now();
    for e in &events {
        store.insert(std::slice::from_ref(e)).unwrap();
    }
    let single = per_event_n as f64 / start.elapsed().as_secs_f64();

    let batched_n = 100_000;
    let (sink, rx) = toolwall::EventSink::channel();
    let writer =
        toolwall::bench::spawn_writer(Store::open(&dir.path().join("batched.db")).unwrap(), rx);
    let events: Vec<Event> = (0..batched_n).map(event).collect();
    let start = Instant::now();
    for e in events {
        sink.emit(e);
    }
    drop(sink);
    assert_eq!(writer.join().unwrap(), batched_n as u64);
    let batched = batched_n as f64 / start.elapsed().as_secs_f64();
    println!("   one transaction per event  {single:>10.0} events/s  1.00x");
    println!(
        "   batched writer             {batched:>10.0} events/s  {:.1}x  (goal: > 50,000)",
        batched / single
    );
}

/// OTLP export: events per second from the store to a collector over OTLP/HTTP —
/// read, correlated, converted, encoded and sent by the real exporter — next to the batched
/// writer's rate into the same store in the same run (the ratio says whether the export keeps
/// up with the fastest the layers can record). The collector is a loopback HTTP server that
/// reads each request and answers 200 without decoding, so the time is the exporter's.
fn bench_export() {
    println!(
        "== OTLP export: events per second from the store to a collector (OTLP/HTTP, loopback)"
    );
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("export.db");
    // A kernel flood's mix (as the correlator's bench): mostly connections, in every 100
    // events one intercepted call and its execution.
    let n = 60_000;
    let (sink, rx) = toolwall::EventSink::channel();
    let writer = toolwall::bench::spawn_writer(Store::open(&db).unwrap(), rx);
    let start = Instant::now();
    for e in correlate_events(n) {
        sink.emit(e.event);
    }
    drop(sink);
    assert_eq!(writer.join().unwrap(), n as u64);
    let write_rate = n as f64 / start.elapsed().as_secs_f64();

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let received = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let bytes_in = received.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let bytes_in = bytes_in.clone();
            std::thread::spawn(move || collector_connection(stream, &bytes_in));
        }
    });
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let cpu_before = process_cpu();
    let start = Instant::now();
    let (logs, spans) = runtime
        .block_on(toolwall::bench::bench_export(
            &db,
            &format!("http://{addr}"),
        ))
        .unwrap();
    let took = start.elapsed();
    let cpu = process_cpu() - cpu_before;
    assert_eq!(logs, n as u64, "every event left as a log record");
    let rate = n as f64 / took.as_secs_f64();
    println!("   batched writer into the store {write_rate:>10.0} events/s  1.00x");
    println!(
        "   export to the collector       {rate:>10.0} events/s  {:.2}x  ({spans} spans; {:.1} MB sent; {:.1} µs CPU per event, the collector's reading included)",
        rate / write_rate,
        received.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e6,
        cpu.as_secs_f64() * 1e6 / n as f64
    );
}

/// One keep-alive HTTP/1.1 connection of the bench's collector: reads each request whole
/// (headers, then `Content-Length` bytes) and answers 200 with an empty protobuf body.
fn collector_connection(stream: TcpStream, received: &std::sync::atomic::AtomicU64) {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0usize;
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value.trim().parse().unwrap_or(0);
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        received.fetch_add(length as u64, std::sync::atomic::Ordering::Relaxed);
        if writer
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n")
            .is_err()
        {
            return;
        }
    }
}

/// This process's user + system CPU time.
fn process_cpu() -> Duration {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes the struct we own.
    let usage = unsafe {
        libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr());
        usage.assume_init()
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// `n` stored events as a kernel flood leaves them: every 0.5 ms a connection, and in every 100
/// events one intercepted call and its execution; four (session, server) pairs take turns.
fn correlate_events(n: usize) -> Vec<StoredEvent> {
    let start = chrono::DateTime::from_timestamp_millis(1_800_000_000_000).unwrap_or_default();
    (0..n)
        .map(|i| {
            let timestamp = start + chrono::Duration::microseconds(500 * i as i64);
            let (session_id, server_id) =
                (format!("s{}", i / 100 % 2), format!("srv{}", i / 200 % 2));
            let input = Some(serde_json::json!({"n": i / 100}));
            let event = match i % 100 {
                0 => Event::McpToolCallIntercepted(ToolCallIntercepted {
                    policy_revision: None,
                    timestamp,
                    session_id,
                    request_id: format!("r{i}"),
                    dialect: "anthropic".into(),
                    tool_name: format!("mcp__{server_id}__echo"),
                    server_tool: "echo".into(),
                    tool_call_id: format!("toolu_{i}"),
                    input,
                    server_id,
                    server_type: "http".into(),
                    server_addr: String::new(),
                    tool_hash: String::new(),
                    action: Action::Allow,
                    reason: String::new(),
                }),
                3 => Event::McpToolCalled(ToolCalled {
                    policy_revision: None,
                    timestamp,
                    session_id,
                    server_id,
                    server_type: "http".into(),
                    tool_name: "echo".into(),
                    jsonrpc_id: serde_json::json!(i),
                    input,
                    action: Action::Allow,
                    reason: String::new(),
                    layer: "mcp-proxy".into(),
                }),
                _ => Event::McpNetworkConnection(NetworkConnection {
                    policy_revision: None,
                    timestamp,
                    session_id,
                    remote_addr: "127.0.0.1:3001".into(),
                    server_id,
                    server_type: "http".into(),
                    action: Action::Allow,
                    pid: 1,
                    tid: 1,
                    uid: 0,
                    comm: "node".into(),
                    exe: None,
                    cmdline: None,
                    ppid: None,
                    cgroup_id: 1,
                    socket_cookie: i as u64,
                    protocol: "tcp".into(),
                    family: "ipv4".into(),
                    count: 1,
                    since: None,
                }),
            };
            StoredEvent {
                id: i as i64 + 1,
                event,
            }
        })
        .collect()
}

/// `Correlator::batch` (what `/api/calls` and `toolwall mcp calls --db` run) over a kernel
/// flood, against a plain clone of the same events. Goal: 1M events in seconds, and
/// linear: 4x the events, about 4x the time (a linear search per event made it quadratic).
fn bench_correlate() {
    println!("== correlator: batch over a flood of kernel connections (1% calls)");
    let window = Duration::from_secs(2);
    let mut times = Vec::new();
    for n in [250_000, 1_000_000] {
        let events = correlate_events(n);
        let start = Instant::now();
        black_box(events.clone());
        let copy = start.elapsed().as_secs_f64();
        let start = Instant::now();
        let records = toolwall::bench::Correlator::batch(
            window,
            toolwall::bench::value_hash,
            black_box(&events),
        );
        let batch = start.elapsed().as_secs_f64();
        black_box(&records);
        println!("   {n:>9} events: clone       {copy:>8.3} s  1.00x");
        println!(
            "   {n:>9} events: correlate   {batch:>8.3} s  {:.2}x  {:>10.0} events/s  ({} records)",
            batch / copy,
            n as f64 / batch,
            records.len()
        );
        times.push(batch);
    }
    println!(
        "   time for 1M events / 250k events: {:.2}x (linear: about 4x; quadratic: 16x)",
        times[1] / times[0]
    );
}

/// ns per policy decision with 1,000 rules, against the same decision with no rules.
/// Goal: under 1 µs per decision.
fn bench_policy() {
    println!("== policy: ns per check_call (name forms mixed: bare, by server, mcp__server__tool)");
    let iterations = 200_000;
    let _warm = toolwall::bench::bench_decisions(0, iterations / 10);
    let empty = toolwall::bench::bench_decisions(0, iterations).as_nanos() as f64;
    let full = toolwall::bench::bench_decisions(1000, iterations).as_nanos() as f64;
    let cold = toolwall::bench::bench_rule_evaluation(1000, 2_000).as_nanos() as f64;
    println!("   no rules                   {empty:>8.0} ns  1.00x");
    println!(
        "   1,000 rules                {full:>8.0} ns  {:.2}x  (goal: < 1000 ns)",
        full / empty
    );
    println!(
        "   1,000 rules, uncached      {cold:>8.0} ns  {:.2}x  (first call after a definition changes)",
        cold / empty
    );
    for (every, applying) in [(100, "~12 apply"), (10, "~102 apply")] {
        let args = toolwall::bench::bench_argument_decisions(1000, every, iterations / 4).as_nanos()
            as f64;
        println!(
            "   1,000 argument rules, {applying:<10} {args:>8.0} ns  {:.2}x  (a call with its arguments, 1 in {every} rules on every tool; goal: < 5000 ns)",
            args / empty
        );
    }
}

/// MB/s of result inspection on three kinds of text, against a `serde_json` parse
/// of the same message. Goal: >= 200 MB/s on text.
fn bench_results() {
    println!(
        "== result inspection: MB/s of a 4 MB tools/call result in 4 KiB text items (default rules: gitleaks, redact)"
    );
    for (name, text) in [
        ("prose", toolwall::bench::ResultText::Prose),
        (
            "code (keywords, no secret)",
            toolwall::bench::ResultText::Code,
        ),
        (
            "code, a secret per item",
            toolwall::bench::ResultText::Secrets,
        ),
    ] {
        let message = toolwall::bench::result_message(4 << 20, text);
        let (inspect, parse) = toolwall::bench::bench_result_inspection(&message, 10);
        println!(
            "   {name:<27} {inspect:>8.0} MB/s  {:.2}x a serde_json parse ({parse:.0} MB/s)  (goal: >= 200 MB/s)",
            inspect / parse
        );
    }
}

/// MB/s of the SSE framing alone (decode every event, copy it out), in the interceptor's
/// 16 KiB reads: what any SSE-aware forwarder pays before inspecting anything.
fn framing_mbps(stream: &[u8], iters: u32) -> f64 {
    let mut out = BytesMut::with_capacity(64 * 1024);
    let stream = bytes::Bytes::copy_from_slice(stream);
    let start = Instant::now();
    for _ in 0..iters {
        let mut decoder = toolwall::bench::SseDecoder::new(16 << 20);
        for at in (0..stream.len()).step_by(16 * 1024) {
            let chunk = stream.slice(at..(at + 16 * 1024).min(stream.len()));
            decoder.feed(black_box(chunk));
            while let Ok(Some(event)) = decoder.next_event() {
                black_box(decoder.last_data().data(&event));
                out.extend_from_slice(&event);
            }
            black_box(&out);
            out.clear();
        }
        out.extend_from_slice(&decoder.finish());
        out.clear();
    }
    (stream.len() as f64 * f64::from(iters)) / start.elapsed().as_secs_f64() / 1e6
}

/// Interceptor throughput on a text-heavy and a tool-heavy Anthropic stream, against a plain
/// copy and against the SSE framing alone over the same bytes: the cost of inspection alone.
fn bench_interceptor() {
    println!("== LLM interceptor: MB/s on 4 MB Anthropic streams in 16 KiB reads (release build)");
    const BYTES: usize = 4 << 20;
    const ITERS: u32 = 20;
    let report = toolwall::bench::bench_interceptor(BYTES, ITERS);
    let text = toolwall::bench::text_heavy_stream(BYTES);
    let tool = toolwall::bench::tool_heavy_stream(BYTES);
    framing_mbps(&text, 1); // warm-up
    let frame_text = framing_mbps(&text, ITERS);
    let frame_tool = framing_mbps(&tool, ITERS);
    for (name, copy, frame, intercept) in [
        (
            "text-heavy",
            report.copy_text_mbps,
            frame_text,
            report.intercept_text_mbps,
        ),
        (
            "tool-heavy",
            report.copy_tool_mbps,
            frame_tool,
            report.intercept_tool_mbps,
        ),
    ] {
        println!("   {name}: plain copy        {copy:>8.0} MB/s  1.00x");
        println!(
            "   {name}: SSE framing only  {frame:>8.0} MB/s  {:.3}x of copy",
            frame / copy
        );
        println!(
            "   {name}: interceptor       {intercept:>8.0} MB/s  {:.3}x of copy  {:.2}x of framing",
            intercept / copy,
            intercept / frame
        );
    }
    println!(
        "   (in memory, no I/O: what inspection costs per byte against an in-cache memcpy; the tool-heavy stream blocks every other call; the 0.80x goal is judged through the proxy: llm-throughput)"
    );
    // Per-call bookkeeping must be O(1): 4x the calls, about 4x the time (finding calls by
    // linear search makes it quadratic: 17x for 60k against 15k calls).
    println!("   many calls in one response (every other blocked): time for 60k calls / 15k calls");
    for (name, dialect) in [
        ("Anthropic", toolwall::bench::Dialect::Anthropic),
        ("Chat Completions", toolwall::bench::Dialect::OpenAiChat),
        ("Responses", toolwall::bench::Dialect::OpenAiResponses),
        ("Gemini", toolwall::bench::Dialect::Gemini),
    ] {
        let small = toolwall::bench::many_calls_stream(dialect, 15_000);
        let large = toolwall::bench::many_calls_stream(dialect, 60_000);
        toolwall::bench::time_many_calls(dialect, &small); // warm-up
        let t_small = toolwall::bench::time_many_calls(dialect, &small);
        let t_large = toolwall::bench::time_many_calls(dialect, &large);
        let ratio = t_large / t_small;
        println!(
            "     {name:<18} 15k {:>7.1} ms  60k {:>7.1} ms  {ratio:.1}x (goal ≤ 6x, linear is 4x: {})",
            t_small * 1e3,
            t_large * 1e3,
            if ratio <= 6.0 { "MET" } else { "NOT MET" }
        );
    }
}
