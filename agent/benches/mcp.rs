//! `mcp-latency`: what the shim, the daemon's relay and the filter proxy add to one
//! `tools/call` round trip, next to a plain nginx hop, a bare hyper relay that judges nothing
//! (`hyper_relay.rs`) and a bare TCP copy in the same rounds.

use super::*;

/// nginx (one process) in front of `127.0.0.1:port` with upstream keep-alive and no
/// buffering; its port.
fn start_nginx_keepalive(dir: &Path, port: u16) -> Result<(Proc, u16), String> {
    let listen = free_port();
    let proc = relay::run_nginx(
        dir,
        &format!(
            "upstream mcp {{ server 127.0.0.1:{port}; keepalive 8; }}\n\
             server {{ listen 127.0.0.1:{listen}; location / {{ proxy_pass http://mcp; proxy_http_version 1.1; proxy_set_header Connection \"\"; proxy_buffering off; }} }}\n"
        ),
        listen,
    )?;
    Ok((proc, listen))
}

/// A relay with no protocol at all in front of `127.0.0.1:port`: per connection, two threads
/// copying bytes between the client and the upstream. What one more process and loopback hop
/// cost by themselves, the floor under any proxy's added latency on this machine. Its port.
fn tcp_copy_relay(port: u16) -> std::io::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let relay_port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(("127.0.0.1", port)) else {
                continue;
            };
            let pairs = (|| {
                client.set_nodelay(true)?;
                server.set_nodelay(true)?;
                Ok::<_, std::io::Error>([
                    (client.try_clone()?, server.try_clone()?),
                    (server, client),
                ])
            })();
            for (mut from, mut to) in pairs.into_iter().flatten() {
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut from, &mut to);
                    let _ = to.shutdown(std::net::Shutdown::Write);
                });
            }
        }
    });
    Ok(relay_port)
}

/// One round of `mcp_bench.py pair`: `direct` and `through` sessions open side by side, their
/// calls interleaved one by one — `((p50, p99) direct, (p50, p99) through)`, µs. Runs one after
/// the other (even alternating per round) charged each path the machine's moments of its own:
/// single rounds differed by ±100 µs, more than the effect measured.
fn mcp_pair(
    python: &Path,
    script: &Path,
    calls: usize,
    direct: &[String],
    through: &[String],
) -> Result<Round, String> {
    let spec = |argv: &[String]| serde_json::to_string(argv).unwrap_or_default();
    let output = Command::new(python)
        .arg(script)
        .args(["pair", &calls.to_string(), &spec(direct), &spec(through)])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run {}: {e}", script.display()))?;
    if !output.status.success() {
        return Err(format!(
            "mcp_bench.py pair failed: {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("mcp_bench.py printed no report ({e})"))?;
    let side = |k: &str| {
        (
            report[k]["p50_us"].as_f64().unwrap_or(f64::NAN),
            report[k]["p99_us"].as_f64().unwrap_or(f64::NAN),
        )
    };
    Ok((side("a"), side("b")))
}

/// One round of `mcp_bench.py multi`: the `paths` (a session spec, and the pid whose CPU is
/// measured) open side by side, their calls interleaved one by one, the order rotated each
/// turn — per path `(p50, p99, CPU per call)`, µs (CPU: user and system of every thread of the
/// pid, from the scheduler; NaN without a pid).
fn mcp_multi(
    python: &Path,
    script: &Path,
    calls: usize,
    paths: &[(Vec<String>, Option<u32>)],
) -> Result<Vec<(f64, f64, f64)>, String> {
    let specs: Vec<String> = paths
        .iter()
        .map(|(spec, pid)| match pid {
            Some(pid) => serde_json::json!({"spec": spec, "pid": pid}).to_string(),
            None => serde_json::to_string(spec).unwrap_or_default(),
        })
        .collect();
    let output = Command::new(python)
        .arg(script)
        .args(["multi", &calls.to_string()])
        .args(&specs)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("run {}: {e}", script.display()))?;
    if !output.status.success() {
        return Err(format!(
            "mcp_bench.py multi failed: {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("mcp_bench.py printed no report ({e})"))?;
    let number = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    let sessions = report["sessions"]
        .as_array()
        .filter(|s| s.len() == paths.len())
        .ok_or("mcp_bench.py multi reported another number of sessions")?;
    Ok(sessions
        .iter()
        .map(|s| {
            (
                number(&s["p50_us"]),
                number(&s["p99_us"]),
                number(&s["cpu_us_per_call"]),
            )
        })
        .collect())
}

/// A process's resident memory, kB: `(anonymous, file-backed)` — the second is the binary's
/// own pages, shared page cache the kernel maps in large folios (on this kernel nearly all of
/// a 21 MB text once a few pages of it run).
fn memory_kb(pid: u32) -> Option<(u64, u64)> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| -> Option<u64> {
        rollup
            .lines()
            .find_map(|l| l.strip_prefix(name))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    Some((field("Pss_Anon:")?, field("Pss_File:")?))
}

/// Added latency per `tools/call` through `toolwall shim` (stdio) and `toolwall mcp-proxy`
/// (Streamable HTTP) against direct connections to `server-everything`, and the RSS of an idle
/// proxy. Goals: < 100 µs p50 added; RSS < 15 MB.
pub(super) fn bench_mcp_latency() {
    println!("== MCP: latency per tools/call (get-sum, Python raw JSON-RPC client), µs");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let bin = std::env::var_os("TOOLWALL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/release/toolwall"));
    let peers = std::env::var_os("TOOLWALL_PEERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/peers"));
    let python = peers.join("venv/bin/python");
    let server = peers.join("node/node_modules/.bin/mcp-server-everything");
    let script = root.join("tests/peers/mcp_bench.py");
    for (path, what) in [
        (
            &bin,
            "the toolwall binary (cargo build --release -p agent, or set TOOLWALL_BIN)",
        ),
        (&python, "the Python peer venv (cargo xtask peers)"),
        (&server, "server-everything (cargo xtask peers)"),
        (&script, "tests/peers/mcp_bench.py"),
    ] {
        if !path.exists() {
            println!("   SKIPPED: {} is missing: {what}", path.display());
            return;
        }
    }
    if let Err(why) = mcp_latency(&bin, &python, &server, &script) {
        println!("   FAILED: {why}");
    }
}

/// One round's (p50, p99) direct and through toolwall, µs.
type Round = ((f64, f64), (f64, f64));

fn mcp_latency(bin: &Path, python: &Path, server: &Path, script: &Path) -> Result<(), String> {
    // ROUNDS rounds of PER calls on each path, direct and through toolwall interleaved call by
    // call (`mcp_pair`); the added cost is the median of the rounds' differences of p50s.
    const ROUNDS: usize = 7;
    const PER: usize = 400;
    let s = |p: &Path| p.display().to_string();
    let rounds = |direct: &[String], through: &[String]| -> Result<Vec<Round>, String> {
        (0..ROUNDS)
            .map(|_| mcp_pair(python, script, PER, direct, through))
            .collect()
    };
    // A rule that matches nothing, so the filter runs its full check on every call.
    let deny = ["--deny".to_owned(), "^toolwall-bench-none$".to_owned()];

    let direct_stdio = vec!["stdio".into(), s(server), "stdio".into()];
    let mut shim = vec!["stdio".into(), s(bin), "shim".into()];
    shim.extend(deny.iter().cloned());
    shim.push("--".into());
    shim.extend([s(server), "stdio".into()]);
    let stdio = rounds(&direct_stdio, &shim)?;

    // Inside a session the shim is a pipe to the daemon, which runs and filters the server
    // (`daemon/stdio.rs`): the agent's shim -> daemon -> server, against the server direct.
    let daemon_dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let socket = daemon_dir.path().join("api.sock");
    let config = daemon_dir.path().join("toolwall.yaml");
    std::fs::write(
        &config,
        format!(
            "proxy: {{mode: disabled}}\nnetmon: {{enabled: false}}\nstore: {{path: {}}}\napi: {{listen: 127.0.0.1:{}, socket: {}}}\n",
            daemon_dir.path().join("events.db").display(),
            free_port(),
            socket.display()
        ),
    )
    .map_err(|e| format!("write the daemon's config: {e}"))?;
    let _daemon = start_daemon(bin, &config, &socket)?;
    let mut relay = vec![
        "stdio".into(),
        "/usr/bin/env".into(),
        format!("TOOLWALL_API_SOCKET={}", socket.display()),
        s(bin),
        "shim".into(),
    ];
    relay.extend(deny.iter().cloned());
    relay.push("--".into());
    relay.extend([s(server), "stdio".into()]);
    let relayed = rounds(&direct_stdio, &relay)?;

    let port = free_port();
    let _server = start_listening(
        Command::new(server)
            .arg("streamableHttp")
            .env("PORT", port.to_string()),
        port,
        "server-everything streamableHttp",
    )?;
    let upstream = format!("http://127.0.0.1:{port}/mcp");
    let proxy_port = free_port();
    let proxy = start_listening(
        Command::new(bin)
            .args(["mcp-proxy", "--upstream", &upstream, "--listen"])
            .arg(format!("127.0.0.1:{proxy_port}"))
            .args(&deny),
        proxy_port,
        "toolwall mcp-proxy",
    )?;
    std::thread::sleep(Duration::from_millis(300));
    let memory_fresh = memory_kb(proxy.0.id());
    let http = |url: &str| vec!["http".to_owned(), url.to_owned()];
    let proxied_url = format!("http://127.0.0.1:{proxy_port}/mcp");
    // For reference, a bare nginx hop in front of the same server (upstream keep-alive,
    // no buffering: the closest thing to what the proxy does, minus the judging).
    let nginx_dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
    let nginx = start_nginx_keepalive(nginx_dir.path(), port);
    // And the hop itself: bytes copied between two sockets by two threads, no HTTP at all.
    let copy_port = tcp_copy_relay(port).map_err(|e| format!("the TCP copy relay: {e}"))?;
    let copy_url = format!("http://127.0.0.1:{copy_port}/mcp");
    // And the floor under the proxy: HTTP both ways as the proxy does it (hyper), nothing judged.
    let bare = super::hyper_relay::start(port);
    let bare_pid = bare.as_ref().ok().map(|(proc, _)| proc.0.id());
    // One client, every path interleaved call by call in each round (`mcp_bench.py multi`):
    // the proxy and nginx are compared on the same moments of the machine, latency and CPU.
    let nginx_pid = nginx.as_ref().ok().map(|(proc, _)| proc.0.id());
    let nginx_url = nginx
        .as_ref()
        .ok()
        .map(|(_, p)| format!("http://127.0.0.1:{p}/mcp"));
    let mut paths = vec![
        (http(&upstream), None),
        (http(&copy_url), None),
        (http(&proxied_url), Some(proxy.0.id())),
    ];
    if let Some(url) = &nginx_url {
        paths.push((http(url), nginx_pid));
    }
    let bare_at = paths.len();
    if let Ok((_, p)) = &bare {
        paths.push((http(&format!("http://127.0.0.1:{p}/mcp")), bare_pid));
    }
    let mut nginx_rounds = Vec::new();
    let mut copy_rounds = Vec::new();
    let mut http_rounds = Vec::new();
    // CPU per call (µs, user and system) of the proxy and of nginx, per round.
    let mut proxy_cpu = Vec::new();
    let mut nginx_cpu = Vec::new();
    let (mut bare_rounds, mut bare_cpu) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let sessions = mcp_multi(python, script, PER, &paths)?;
        let side = |i: usize| (sessions[i].0, sessions[i].1);
        copy_rounds.push((side(0), side(1)));
        http_rounds.push((side(0), side(2)));
        proxy_cpu.push(sessions[2].2);
        if nginx_url.is_some() {
            nginx_rounds.push((side(0), side(3)));
            nginx_cpu.push(sessions[3].2);
        }
        if bare.is_ok() {
            bare_rounds.push((side(0), side(bare_at)));
            bare_cpu.push(sessions[bare_at].2);
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let memory_after = memory_kb(proxy.0.id());

    let verdict = |added: f64| if added < 100.0 { "MET" } else { "NOT MET" };
    let report = |name: &str, through: &str, rounds: &[Round]| {
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let direct_p50 = median(rounds.iter().map(|r| r.0.0).collect());
        let direct_p99 = median(rounds.iter().map(|r| r.0.1).collect());
        let through_p50 = median(rounds.iter().map(|r| r.1.0).collect());
        let through_p99 = median(rounds.iter().map(|r| r.1.1).collect());
        let added: Vec<f64> = rounds.iter().map(|r| r.1.0 - r.0.0).collect();
        let added_median = median(added.clone());
        println!("   {name:<10} direct  p50 {direct_p50:>6.0}  p99 {direct_p99:>6.0}");
        println!(
            "   {name:<10} {through:<7} p50 {through_p50:>6.0}  p99 {through_p99:>6.0}  {:.2}x",
            through_p50 / direct_p50
        );
        let per_round: Vec<String> = added.iter().map(|a| format!("{a:+.0}")).collect();
        println!(
            "   {name:<10} added p50 per round [{}] µs, median {added_median:+.0} µs (goal < 100 µs: {})",
            per_round.join(", "),
            verdict(added_median)
        );
    };
    report("stdio", "shim", &stdio);
    report("relay", "daemon", &relayed);
    report("HTTP", "proxy", &http_rounds);
    match &nginx {
        Ok(_) => report("HTTP", "nginx", &nginx_rounds),
        Err(why) => println!("   HTTP nginx reference SKIPPED: {why}"),
    }
    match &bare {
        Ok(_) => report("HTTP", "hyper", &bare_rounds),
        Err(why) => println!("   HTTP bare hyper relay SKIPPED: {why}"),
    }
    report("TCP", "copy", &copy_rounds);
    let added = |rounds: &[Round]| {
        let mut v: Vec<f64> = rounds.iter().map(|r| r.1.0 - r.0.0).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let hop = added(&copy_rounds);
    print!(
        "   above the bare hop (TCP copy, {hop:+.0} µs): filter proxy {:+.0} µs",
        added(&http_rounds) - hop
    );
    match nginx.is_ok() {
        true => println!(", nginx {:+.0} µs", added(&nginx_rounds) - hop),
        false => println!(),
    }
    println!(
        "   ({ROUNDS} rounds of {PER} calls per path, every path interleaved call by call; medians over rounds)"
    );
    if nginx.is_ok() {
        // The goals, against the same nginx hop in the same rounds: added latency at most
        // 1.2 times nginx's, CPU per call at most nginx's. Each round's ratio, then their
        // median: a round's moments of the machine fall on both.
        let ratios = |a: Vec<f64>, b: Vec<f64>| {
            let mut r: Vec<f64> = a.iter().zip(&b).map(|(a, b)| a / b).collect();
            r.sort_by(f64::total_cmp);
            r[r.len() / 2]
        };
        let added_each = |rounds: &[Round]| rounds.iter().map(|r| r.1.0 - r.0.0).collect();
        let latency = ratios(added_each(&http_rounds), added_each(&nginx_rounds));
        let mid = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let cpu = ratios(proxy_cpu.clone(), nginx_cpu.clone());
        let met = |ok: bool| if ok { "MET" } else { "NOT MET" };
        println!(
            "   filter proxy / nginx, same rounds: added p50 {latency:.2}x (goal <= 1.2: {}); CPU per call {:.0} / {:.0} µs = {cpu:.2}x (goal <= 1.0: {})",
            met(latency <= 1.2),
            mid(proxy_cpu),
            mid(nginx_cpu.clone()),
            met(cpu <= 1.0)
        );
        if bare.is_ok() {
            println!(
                "   bare hyper relay (nothing judged) / nginx, same rounds: added p50 {:.2}x; CPU per call {:.0} / {:.0} µs = {:.2}x",
                ratios(added_each(&bare_rounds), added_each(&nginx_rounds)),
                mid(bare_cpu.clone()),
                mid(nginx_cpu.clone()),
                ratios(bare_cpu, nginx_cpu)
            );
        }
    }
    let mb = |kb: u64| kb as f64 / 1024.0;
    let shown = |m: Option<(u64, u64)>| match m {
        Some((anon, file)) => format!(
            "{:.1} MB ({:.1} MB its own, {:.1} MB the binary's pages)",
            mb(anon + file),
            mb(anon),
            mb(file)
        ),
        None => "unknown".to_owned(),
    };
    let own = memory_fresh
        .into_iter()
        .chain(memory_after)
        .map(|(anon, _)| mb(anon))
        .fold(0.0, f64::max);
    println!(
        "   mcp-proxy memory: idle after start {}, idle after {} calls {} (goal: < 15 MB of its own: {})",
        shown(memory_fresh),
        ROUNDS * (PER + 200),
        shown(memory_after),
        if own < 15.0 { "MET" } else { "NOT MET" }
    );
    Ok(())
}
