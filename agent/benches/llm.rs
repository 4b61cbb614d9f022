//! `llm-throughput` and `llm-latency`: the whole LLM proxy on loopback, in process, and the
//! release binary as a relay next to nginx (`relay.rs`).

use super::*;

/// Stream throughput through the whole LLM proxy on loopback: inspected (text-heavy and
/// tool-heavy) against the same proxy copying the same bytes through uninspected.
/// Goal: text-heavy at ≥ 80% of plain-copy throughput.
pub(super) fn bench_llm_throughput() {
    println!(
        "== LLM proxy: stream throughput on loopback, MB/s (median of 15 responses of 32 MB per path)"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let report = match runtime.block_on(toolwall::bench::bench_proxy_throughput(32 << 20, 15)) {
        Ok(report) => report,
        Err(error) => {
            println!("   FAILED: {error:#}");
            return;
        }
    };
    let row = |name: &str, mbps: f64| {
        println!(
            "   {name:<40} {mbps:>8.0} MB/s  {:.2}x of plain copy",
            mbps / report.copy_mbps
        );
    };
    row("direct (no proxy)", report.direct_mbps);
    row("proxy, plain copy (uninspected path)", report.copy_mbps);
    row("proxy, text-heavy inspected", report.text_mbps);
    row(
        "proxy, tool-heavy inspected (half blocked)",
        report.tool_mbps,
    );
    let ratios = &report.text_ratios;
    println!(
        "   text-heavy / plain copy, per round (back to back): median {:.2}x, range {:.2}–{:.2}x",
        report.text_ratio(),
        ratios.first().copied().unwrap_or(0.0),
        ratios.last().copied().unwrap_or(0.0)
    );
    println!(
        "   (goal: text-heavy ≥ 0.80x of the proxy's plain copy: {}, at {:.2}x, the median per-round ratio)",
        if report.text_ratio() >= 0.8 {
            "MET"
        } else {
            "NOT MET"
        },
        report.text_ratio()
    );
}

/// Per-event and first-byte latency through the whole LLM proxy on loopback, against the same
/// fake upstream direct. Goal: < 50 µs p50 added per event.
pub(super) fn bench_llm_latency() {
    println!("== LLM proxy: latency per event and to first byte, loopback, µs");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let report = match runtime.block_on(toolwall::bench::bench_proxy_latency(20, 200)) {
        Ok(report) => report,
        Err(error) => {
            println!("   FAILED: {error:#}");
            return;
        }
    };
    let (d50, d99) = report.direct_event_us;
    let (p50, p99) = report.proxied_event_us;
    let (t50, t99) = report.direct_ttfb_us;
    let (q50, q99) = report.proxied_ttfb_us;
    println!("   per event, direct     p50 {d50:>7.0}  p99 {d99:>7.0}  1.00x");
    println!(
        "   per event, proxied    p50 {p50:>7.0}  p99 {p99:>7.0}  {:.2}x  added p50 {:+.0} µs",
        p50 / d50,
        report.added_event_p50_us()
    );
    println!("   first byte, direct    p50 {t50:>7.0}  p99 {t99:>7.0}  1.00x");
    println!(
        "   first byte, proxied   p50 {q50:>7.0}  p99 {q99:>7.0}  {:.2}x  added p50 {:+.0} µs",
        q50 / t50,
        q50 - t50
    );
    let added = report.added_event_p50_us();
    println!(
        "   ({} events per path; goal: < 50 µs p50 added per event: {})",
        report.events,
        if added < 50.0 { "MET" } else { "NOT MET" }
    );
}

/// The release binary and nginx as relays of one source, out of process (see `relay.rs`).
struct Relays {
    _dir: tempfile::TempDir,
    _toolwall: Proc,
    _nginx: Proc,
    source: relay::Source,
    bodies: std::sync::Arc<relay::Bodies>,
    list: Vec<relay::Relay>,
}

impl Relays {
    fn start(bytes: usize) -> Result<Relays, String> {
        let bin = toolwall_bin();
        if !bin.exists() {
            return Err(format!(
                "{} is missing (cargo build --release -p agent, or set TOOLWALL_BIN)",
                bin.display()
            ));
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let bodies = std::sync::Arc::new(relay::Bodies::new(bytes));
        let source = relay::Source::start(bodies.clone()).map_err(|e| e.to_string())?;
        let (toolwall, port) = relay::start_toolwall(&bin, dir.path(), source.addr)?;
        let (nginx, buffered, unbuffered) = relay::start_nginx(dir.path(), source.addr)?;
        let at = |port: u16| std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let (tw, ng) = (Some(toolwall.0.id()), Some(nginx.0.id()));
        let list = vec![
            relay::Relay {
                name: "direct (no relay)",
                addr: source.addr,
                path: "/v1/messages",
                pid: None,
            },
            relay::Relay {
                name: "nginx, default config",
                addr: at(buffered),
                path: "/v1/messages",
                pid: ng,
            },
            relay::Relay {
                name: "nginx, proxy_buffering off",
                addr: at(unbuffered),
                path: "/v1/messages",
                pid: ng,
            },
            relay::Relay {
                name: "toolwall, uninspected path",
                addr: at(port),
                path: "/v1/files",
                pid: tw,
            },
            relay::Relay {
                name: "toolwall, inspected",
                addr: at(port),
                path: "/v1/messages",
                pid: tw,
            },
        ];
        Ok(Relays {
            _dir: dir,
            _toolwall: toolwall,
            _nginx: nginx,
            source,
            bodies,
            list,
        })
    }
}

const NGINX: usize = 1;
const TOOLWALL_COPY: usize = 3;
const TOOLWALL: usize = 4;

/// Throughput and CPU per GB of the release binary as a relay next to nginx, for the
/// event-framed source and the 64 KiB-chunk one. Goals, inspected: event-framed, throughput
/// ≥ 1.0x nginx default and relay CPU per GB ≤ 1.0x nginx's; 64 KiB chunks, ≥ 0.8x the proxy's
/// plain copy and ≥ 1.2x nginx default.
pub(super) fn bench_relay_throughput() {
    const BYTES: usize = 16 << 20;
    const ROUNDS: usize = 7;
    println!(
        "== LLM proxy as a relay, out of process, next to nginx: text-heavy stream of {} MB, median of {ROUNDS} rounds",
        BYTES >> 20
    );
    let relays = match Relays::start(BYTES) {
        Ok(r) => r,
        Err(why) => {
            println!("   SKIPPED: {why}");
            return;
        }
    };
    for (framing, query) in [
        ("event-framed (one HTTP chunk per SSE event)", "events"),
        ("64 KiB chunks", "bulk"),
    ] {
        println!("   {framing}:");
        for r in &relays.list {
            if let Err(why) = relay::verify(r, query, &relays.bodies.payload) {
                println!("   FAILED: {why}");
                return;
            }
        }
        let n = relays.list.len();
        let (mut mbps, mut cpu) = (vec![Vec::new(); n], vec![Duration::ZERO; n]);
        for _ in 0..ROUNDS {
            for (i, r) in relays.list.iter().enumerate() {
                match relay::read_through(r, query) {
                    Ok((wall, used)) => {
                        mbps[i].push(relays.bodies.payload.len() as f64 / wall.as_secs_f64() / 1e6);
                        cpu[i] += used;
                    }
                    Err(why) => {
                        println!("   FAILED: {why}");
                        return;
                    }
                }
            }
        }
        let gb = (relays.bodies.payload.len() * ROUNDS) as f64 / 1e9;
        let mbps: Vec<f64> = mbps
            .into_iter()
            .map(|mut v| {
                v.sort_by(f64::total_cmp);
                v[v.len() / 2]
            })
            .collect();
        let cpu_gb: Vec<f64> = cpu.iter().map(|c| c.as_secs_f64() / gb).collect();
        for (i, r) in relays.list.iter().enumerate() {
            let cpu = if r.pid.is_some() {
                format!(
                    "relay CPU {:>6.2} s/GB  {:.2}x of nginx's",
                    cpu_gb[i],
                    cpu_gb[i] / cpu_gb[NGINX]
                )
            } else {
                String::new()
            };
            println!(
                "     {:<28} {:>6.0} MB/s  {:.2}x of nginx  {cpu}",
                r.name,
                mbps[i],
                mbps[i] / mbps[NGINX]
            );
        }
        let met = |ok: bool| if ok { "MET" } else { "NOT MET" };
        let thr = mbps[TOOLWALL] / mbps[NGINX];
        let copy = mbps[TOOLWALL] / mbps[TOOLWALL_COPY];
        if query == "events" {
            let cpu = cpu_gb[TOOLWALL] / cpu_gb[NGINX];
            println!(
                "     (goals, inspected: throughput ≥ 1.0x nginx default: {} at {thr:.2}x; relay CPU per GB ≤ 1.0x nginx's: {} at {cpu:.2}x)",
                met(thr >= 1.0),
                met(cpu <= 1.0)
            );
        } else {
            println!(
                "     (goals, inspected: ≥ 0.8x the proxy's plain copy: {} at {copy:.2}x; ≥ 1.2x nginx default: {} at {thr:.2}x)",
                met(copy >= 0.8),
                met(thr >= 1.2)
            );
        }
    }
}

/// Per-event delay of the release binary as a relay next to nginx, the source writing each
/// event only after the client saw the one before. Goals, inspected: p50 ≤ nginx's + 20 µs,
/// p99 ≤ nginx's.
pub(super) fn bench_relay_latency() {
    const EVENTS: usize = 400;
    const ROUNDS: usize = 10;
    println!(
        "== LLM proxy as a relay, out of process, next to nginx: delay per event, µs ({EVENTS} paced events x {ROUNDS} rounds per relay)"
    );
    let relays = match Relays::start(1 << 20) {
        Ok(r) => r,
        Err(why) => {
            println!("   SKIPPED: {why}");
            return;
        }
    };
    let n = relays.list.len();
    let mut delays = vec![Vec::new(); n];
    for r in &relays.list {
        // Warm-up, untimed.
        if let Err(why) = relay::paced(&relays.source, r, 50, &mut Vec::new()) {
            println!("   FAILED: {why}");
            return;
        }
    }
    // Each round's p99 of toolwall inspected against nginx default's, measured back to back.
    let mut p99_ratios = Vec::new();
    let p99 = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * 0.99).round() as usize]
    };
    for _ in 0..ROUNDS {
        let mut round = vec![Vec::new(); n];
        for (i, r) in relays.list.iter().enumerate() {
            if let Err(why) = relay::paced(&relays.source, r, EVENTS, &mut round[i]) {
                println!("   FAILED: {why}");
                return;
            }
        }
        p99_ratios.push(p99(&round[TOOLWALL]) / p99(&round[NGINX]));
        for (all, r) in delays.iter_mut().zip(round) {
            all.extend(r);
        }
    }
    p99_ratios.sort_by(f64::total_cmp);
    let pct: Vec<(f64, f64)> = delays
        .into_iter()
        .map(|mut v| {
            v.sort_by(f64::total_cmp);
            let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
            (at(0.5), at(0.99))
        })
        .collect();
    for (i, r) in relays.list.iter().enumerate() {
        println!(
            "     {:<28} p50 {:>6.0}  p99 {:>6.0}  p50 {:+.0} µs over nginx",
            r.name,
            pct[i].0,
            pct[i].1,
            pct[i].0 - pct[NGINX].0
        );
    }
    let (p50, p99) = pct[TOOLWALL];
    let (n50, n99) = pct[NGINX];
    let met = |ok: bool| if ok { "MET" } else { "NOT MET" };
    println!(
        "     (goals, inspected: p50 ≤ nginx's + 20 µs: {} at {:+.0} µs; p99 ≤ nginx's: {} at {p99:.0} vs {n99:.0})",
        met(p50 <= n50 + 20.0),
        p50 - n50,
        met(p99 <= n99)
    );
    println!(
        "     (p99 inspected / nginx default per round of {EVENTS}: median {:.2}x, range {:.2}–{:.2}x; a p99 moves by tens of µs between runs on this shared machine)",
        p99_ratios[p99_ratios.len() / 2],
        p99_ratios[0],
        p99_ratios[p99_ratios.len() - 1]
    );
}
