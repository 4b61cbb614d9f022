//! The official MCP conformance suite (`@modelcontextprotocol/conformance`, its server scenarios,
//! the active suite) against its reference server (`tests/peers/conformance/everything-server.ts`,
//! vendored from the suite's repository), directly and through `toolwall mcp-proxy` (no tool
//! denied): every scenario that passes directly passes through the proxy too.
//!
//! Each run gets a fresh server. A scenario passes when none of its checks (the suite's
//! `-o DIR/<scenario>-<time>/checks.json`) is a `FAILURE`; `INFO` and `WARNING` do not count.
//! The suite's own output is kept in files (its summary lines are not the test's). Its client
//! (authorization) scenarios run in `mcp_oauth.rs`.

mod mcp_common;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mcp_common::{Proc, free_port, wait_port};
use serde_json::Value;

/// The suite has no time-out of its own: a server-to-client request that never arrives costs
/// the SDK's 60 s request time-out per scenario. A clean run takes a few seconds.
const SUITE_TIMEOUT: Duration = Duration::from_secs(240);

/// The active suite of 0.1.13 has 30 scenarios, all passing against the reference server; far
/// fewer means the setup is broken, and the comparison would prove nothing.
const MIN_DIRECT_PASSES: usize = 25;

/// A file both stdout and stderr of a child go to.
fn log_file(path: &Path) -> (Stdio, Stdio) {
    let file = File::create(path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    let clone = file.try_clone().expect("clone log file");
    (Stdio::from(file), Stdio::from(clone))
}

/// The lines of a log worth showing in a failure message: its last ones, prefixed, without
/// the suite's `N passed, M failed` summaries.
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.contains(" passed, ")).collect();
    lines[lines.len().saturating_sub(25)..]
        .iter()
        .map(|l| format!("    | {l}\n"))
        .collect()
}

/// A directory with the reference server next to a `node_modules` link to the installed
/// packages (Node resolves the server's imports from where the file is).
fn server_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    let source =
        toolwall_tests::workspace_root().join("tests/peers/conformance/everything-server.ts");
    std::fs::copy(&source, dir.path().join("everything-server.ts"))
        .unwrap_or_else(|e| panic!("copy {}: {e}", source.display()));
    // As in the suite's repository: the example server is an ES module.
    std::fs::write(dir.path().join("package.json"), "{\"type\": \"module\"}\n")
        .expect("write package.json");
    std::os::unix::fs::symlink(
        toolwall_tests::conformance_modules(),
        dir.path().join("node_modules"),
    )
    .expect("link node_modules");
    dir
}

/// A fresh reference server (one Node process, `tsx` as a loader); its MCP URL.
fn server(dir: &Path, log: &str) -> (Proc, String) {
    let port = free_port();
    let (stdout, stderr) = log_file(&dir.join(log));
    let child = Command::new("node")
        .args(["--import", "tsx", "everything-server.ts"])
        .current_dir(dir)
        .env("PORT", port.to_string())
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .expect("start the conformance reference server (node)");
    let mut proc = Proc(child);
    wait_port(&mut proc, port, "the conformance reference server");
    (proc, format!("http://127.0.0.1:{port}/mcp"))
}

/// `toolwall mcp-proxy` in front of `upstream`, logging to a file; its MCP URL.
fn proxy(upstream: &str, dir: &Path) -> (Proc, String) {
    let port = free_port();
    let (stdout, stderr) = log_file(&dir.join("proxy.log"));
    let child = Command::new(toolwall_tests::toolwall_bin())
        .args(["mcp-proxy", "--upstream", upstream, "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .expect("start toolwall mcp-proxy");
    let mut proc = Proc(child);
    wait_port(&mut proc, port, "toolwall mcp-proxy");
    (proc, format!("http://127.0.0.1:{port}/mcp"))
}

/// What one suite run found: per scenario, its failed checks (`id: message`), empty if it
/// passed; whether the suite finished in time; where its output is.
struct Run {
    scenarios: BTreeMap<String, Vec<String>>,
    finished: bool,
    log: std::path::PathBuf,
}

impl Run {
    fn passed(&self, scenario: &str) -> bool {
        self.scenarios.get(scenario).is_some_and(Vec::is_empty)
    }

    fn passes(&self) -> usize {
        self.scenarios.values().filter(|f| f.is_empty()).count()
    }
}

/// Runs the active suite of server scenarios against `url`, killed after `SUITE_TIMEOUT`.
fn run_suite(url: &str, dir: &Path, name: &str) -> Run {
    let out = dir.join(format!("results-{name}"));
    let log = dir.join(format!("suite-{name}.log"));
    let (stdout, stderr) = log_file(&log);
    let child = Command::new(toolwall_tests::conformance_suite())
        .args(["server", "--url", url, "--suite", "active", "-o"])
        .arg(&out)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .expect("start the conformance suite");
    let mut suite = Proc(child);
    let deadline = Instant::now() + SUITE_TIMEOUT;
    let finished = loop {
        if suite.0.try_wait().expect("wait for the suite").is_some() {
            break true;
        }
        if Instant::now() >= deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(suite);
    Run {
        scenarios: results(&out),
        finished,
        log,
    }
}

/// The scenarios under `-o DIR`: `server-<scenario>-<YYYY-MM-DDTHH-MM-SS-mmmZ>/checks.json`.
fn results(out: &Path) -> BTreeMap<String, Vec<String>> {
    let mut scenarios = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(out) else {
        return scenarios;
    };
    for entry in entries {
        let entry = entry.expect("read results dir");
        let dir_name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = dir_name.strip_prefix("server-") else {
            continue;
        };
        let Some(scenario) = rest
            .len()
            .checked_sub("-2026-01-01T00-00-00-000Z".len())
            .and_then(|end| rest.get(..end))
        else {
            panic!("unexpected result directory {dir_name}");
        };
        let path = entry.path().join("checks.json");
        let Ok(text) = std::fs::read_to_string(&path) else {
            // A scenario cut short by the time-out: not passed.
            scenarios.insert(scenario.to_owned(), vec!["no checks.json".to_owned()]);
            continue;
        };
        let checks: Vec<Value> = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: not a JSON array of checks: {e}", path.display()));
        let failures = checks
            .iter()
            .filter(|c| c["status"] == "FAILURE")
            .map(|c| {
                format!(
                    "{}: {}",
                    c["id"].as_str().unwrap_or("?"),
                    c["errorMessage"].as_str().unwrap_or("(no message)")
                )
            })
            .collect();
        scenarios.insert(scenario.to_owned(), failures);
    }
    scenarios
}

/// Per scenario: its outcome in one run.
fn listing(run: &Run) -> String {
    run.scenarios
        .iter()
        .map(|(name, failures)| match failures.as_slice() {
            [] => format!("  {name:<34} pass\n"),
            f => format!("  {name:<34} FAIL ({})\n", f.join("; ")),
        })
        .collect()
}

/// Per scenario: direct and proxied outcome, with the failed checks.
fn comparison(direct: &Run, proxied: &Run) -> String {
    let mut names: Vec<&String> = direct.scenarios.keys().collect();
    names.extend(
        proxied
            .scenarios
            .keys()
            .filter(|k| !direct.scenarios.contains_key(*k)),
    );
    names.sort();
    let outcome = |run: &Run, name: &str| match run.scenarios.get(name) {
        None => "missing".to_owned(),
        Some(f) if f.is_empty() => "pass".to_owned(),
        Some(f) => format!("FAIL ({})", f.join("; ")),
    };
    let mut table = format!("  {:<34} {:<8} through the proxy\n", "scenario", "direct");
    for name in names {
        let (d, p) = (outcome(direct, name), outcome(proxied, name));
        let mark = if direct.passed(name) && !proxied.passed(name) {
            "  <-- regression"
        } else {
            ""
        };
        table.push_str(&format!("  {name:<34} {d:<8} {p}{mark}\n"));
    }
    table
}

#[test]
fn every_scenario_passing_directly_passes_through_the_proxy() {
    let dir = server_dir();
    let dir = dir.path();

    let direct = {
        let (_server, url) = server(dir, "server-direct.log");
        run_suite(&url, dir, "direct")
    };
    assert!(
        direct.finished,
        "the conformance suite did not finish within {} s against the reference server directly; scenarios so far:\n{}suite output:\n{}server output:\n{}",
        SUITE_TIMEOUT.as_secs(),
        listing(&direct),
        tail(&direct.log),
        tail(&dir.join("server-direct.log"))
    );
    assert!(
        direct.passes() >= MIN_DIRECT_PASSES,
        "only {} of {} scenarios pass against the reference server directly (want at least {MIN_DIRECT_PASSES}): the setup is broken\n{}suite output:\n{}server output:\n{}",
        direct.passes(),
        direct.scenarios.len(),
        listing(&direct),
        tail(&direct.log),
        tail(&dir.join("server-direct.log"))
    );

    let proxied = {
        let (_server, upstream) = server(dir, "server-proxied.log");
        let (_proxy, url) = proxy(&upstream, dir);
        run_suite(&url, dir, "proxy")
    };
    let regressions: Vec<&String> = direct
        .scenarios
        .keys()
        .filter(|s| direct.passed(s) && !proxied.passed(s))
        .collect();
    let table = comparison(&direct, &proxied);
    let timed_out = if proxied.finished {
        String::new()
    } else {
        format!(
            "the suite through the proxy did not finish within {} s (killed; a server-to-client request that never arrives costs 60 s per scenario)\n",
            SUITE_TIMEOUT.as_secs()
        )
    };
    assert!(
        regressions.is_empty() && proxied.finished,
        "{timed_out}{} scenario(s) pass directly but not through toolwall mcp-proxy: {regressions:?}\n{table}suite output (through the proxy):\n{}proxy output:\n{}",
        regressions.len(),
        tail(&proxied.log),
        tail(&dir.join("proxy.log"))
    );
    println!(
        "conformance: {} of {} scenarios pass directly, {} of {} through toolwall mcp-proxy\n{table}",
        direct.passes(),
        direct.scenarios.len(),
        proxied.passes(),
        proxied.scenarios.len()
    );
}
