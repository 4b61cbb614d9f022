//! The `.deb`: `cargo xtask package` builds it (`cargo xtask test` passes its path in
//! `TOOLWALL_DEB`); here it is installed with `dpkg -i`, its units pass `systemd-analyze
//! verify` (the socket unit holding the conffile's listen addresses), its conffile passes `toolwall config check`, and the installed daemon runs under the
//! unit's capability bounding set and `NoNewPrivileges` (`setpriv`: this host has no systemd as
//! PID 1 to start the unit) with every layer on, telling `NOTIFY_SOCKET` it is ready and, at
//! SIGTERM, that it stops; what it records reaches an OTLP collector and `/metrics`. Purged
//! afterwards.

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use toolwall_tests::{OtlpCollector, http_unix};

const UNIT: &str = "/lib/systemd/system/toolwall.service";
const SOCKET_UNIT: &str = "/lib/systemd/system/toolwall.socket";

/// Removes the package, and the daemon's pins, however the test ends.
struct Installed {
    pin_dir: String,
}

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg")
            .args(["--purge", "toolwall"])
            .stdout(Stdio::null())
            .status();
        let _ = std::fs::remove_dir_all(&self.pin_dir);
    }
}

fn run(command: &mut Command) -> String {
    let out = command.output().expect("run");
    assert!(
        out.status.success(),
        "{command:?}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The unit's `CapabilityBoundingSet` as `setpriv --bounding-set` takes it.
fn bounding_set(unit: &str) -> String {
    let caps = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit bounds the capabilities");
    let mut set = vec!["-all".to_owned()];
    set.extend(
        caps.split_whitespace()
            .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_ascii_lowercase())),
    );
    set.join(",")
}

#[test]
#[ignore = "privileged: installs the package (dpkg -i) and runs its daemon as root"]
fn privileged_the_package_installs_verifies_and_runs_under_its_units_options() {
    let deb = std::env::var("TOOLWALL_DEB").expect(
        "TOOLWALL_DEB: the .deb to test (`cargo xtask test` builds it; or `cargo xtask package`)",
    );
    let pin_dir = format!("/sys/fs/bpf/toolwall-package-{}", std::process::id());
    let _installed = Installed {
        pin_dir: pin_dir.clone(),
    };
    run(Command::new("dpkg").args(["-i", &deb]));
    let conffiles = run(Command::new("dpkg-query").args(["-W", "-f=${Conffiles}", "toolwall"]));
    assert!(
        conffiles.contains("/etc/toolwall/toolwall.yaml"),
        "{conffiles}"
    );
    run(Command::new("systemd-analyze").args(["verify", UNIT, SOCKET_UNIT]));
    // The ports systemd holds are the ones the conffile's daemon serves, or it would refuse
    // to start (`daemon/activation.rs`).
    let socket_unit = std::fs::read_to_string(SOCKET_UNIT).expect("socket unit");
    let conffile = std::fs::read_to_string("/etc/toolwall/toolwall.yaml").expect("conffile");
    let held: Vec<&str> = socket_unit
        .lines()
        .filter_map(|l| l.strip_prefix("ListenStream="))
        .collect();
    assert_eq!(held.len(), 2, "{socket_unit}");
    for addr in held {
        assert!(
            conffile.contains(&format!("listen: {addr}\n")),
            "{addr} is not a listen address of the conffile:\n{conffile}"
        );
    }
    // The README's links to docs/ hold on the host.
    for page in ["README.md", "docs/README.md", "docs/configuration.md"] {
        assert!(
            std::path::Path::new("/usr/share/doc/toolwall")
                .join(page)
                .is_file(),
            "{page} not installed"
        );
    }
    run(Command::new("/usr/bin/toolwall").args(["config", "check", "/etc/toolwall/toolwall.yaml"]));
    let unit = std::fs::read_to_string(UNIT).expect("the unit");
    assert!(unit.contains("Type=notify") && unit.contains("StateDirectory=toolwall"));
    assert!(unit.contains("ExecStart=/usr/bin/toolwall run --config /etc/toolwall/toolwall.yaml"));

    // The installed daemon, as the unit starts it, on private paths.
    let dir = tempfile::tempdir().expect("dir");
    let socket = dir.path().join("api.sock");
    let config = dir.path().join("toolwall.yaml");
    // The fleet's collector: what the installed daemon records reaches it (OTLP/HTTP).
    let collector = OtlpCollector::start("http", 0, &dir.path().join("otlp.jsonl"), &[]);
    std::fs::write(
        &config,
        format!(
            "api:\n  listen: 127.0.0.1:0\n  socket: {}\nstore:\n  path: {}\nproxy:\n  listen: 127.0.0.1:0\nnetmon:\n  pin_dir: {pin_dir}\ntelemetry:\n  otlp:\n    endpoint: http://127.0.0.1:{}\n    protocol: http/protobuf\n    interval_ms: 200\n",
            socket.display(),
            dir.path().join("events.db").display(),
            collector.port
        ),
    )
    .expect("config");
    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).expect("bind NOTIFY_SOCKET");
    notify
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("timeout");
    let mut daemon = Command::new("setpriv")
        .arg(format!("--bounding-set={}", bounding_set(&unit)))
        .args([
            "--inh-caps=-all",
            "--no-new-privs",
            "/usr/bin/toolwall",
            "run",
            "--config",
        ])
        .arg(&config)
        .env("NOTIFY_SOCKET", &notify_path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("setpriv toolwall run");
    let mut buf = [0u8; 4096];
    let n = notify.recv(&mut buf).expect("the daemon says it is ready");
    let said = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(said.contains("READY=1"), "{said}");
    assert!(said.contains("STATUS="), "{said}");
    let (status, health) = http_unix(&socket, "GET", "/health", "").expect("health");
    assert_eq!(status, 200, "{health}");
    let health: Value = serde_json::from_str(&health).expect("json");
    for layer in health["layers"].as_array().expect("layers") {
        assert_eq!(
            layer["on"], true,
            "every layer runs with the unit's capabilities: {layer}"
        );
    }
    // A root agent's stdio server, started by this daemon under the unit's capabilities
    // (without CAP_SETPCAP it could not confine a root server, and none would start).
    let agent = format!(
        r#"import subprocess
shim = subprocess.Popen(["/usr/bin/toolwall", "shim", "--server-id", "everything", "--", {everything:?}, "stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
shim.stdin.write(b'{{"jsonrpc":"2.0","id":0,"method":"initialize","params":{{"protocolVersion":"2025-06-18","capabilities":{{}},"clientInfo":{{"name":"a","version":"1"}}}}}}\n'); shim.stdin.flush()
print(shim.stdout.readline().decode(), flush=True)
shim.stdin.write(b'{{"jsonrpc":"2.0","method":"notifications/initialized"}}\n{{"jsonrpc":"2.0","id":1,"method":"tools/list"}}\n'); shim.stdin.flush()
print(shim.stdout.readline().decode()[:80], flush=True)
shim.stdin.close(); shim.wait()
"#,
        everything = toolwall_tests::server_everything().display().to_string()
    );
    let out = Command::new("/usr/bin/toolwall")
        .args(["exec", "--as-root", "--session", "package", "--config"])
        .arg(&config)
        .args(["--", "python3", "-c", &agent])
        .output()
        .expect("toolwall exec");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("\"protocolVersion\""),
        "a root server ran under the unit's capabilities: {said}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // What the server listed reached the collector as log records, and `/metrics` (what
    // Prometheus scrapes: tests/tests/metrics.rs) counts what the collector took.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !collector
        .lines()
        .iter()
        .any(|l| l["event_name"] == "mcp_tool_seen" && l["resource"]["service.name"] == "toolwall")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the collector got no listing: {:#?}",
            collector.lines()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (status, metrics) = http_unix(&socket, "GET", "/metrics", "").expect("metrics");
    assert_eq!(status, 200, "{metrics}");
    let taken: u64 = metrics
        .lines()
        .find(|l| l.starts_with("toolwall_otlp_export{counter=\"logs\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(taken > 0, "{metrics}");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(daemon.id() as libc::pid_t, libc::SIGTERM) };
    let n = notify.recv(&mut buf).expect("the daemon says it stops");
    assert!(String::from_utf8_lossy(&buf[..n]).contains("STOPPING=1"));
    assert!(daemon.wait().expect("wait").success());
}
