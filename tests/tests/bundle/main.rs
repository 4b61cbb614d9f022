//! Signed policy bundles, through the real binary: `toolwall policy keygen|sign|
//! verify` on the publisher's side; on the host, a daemon polling a bundle server (a small
//! HTTP server here, with ETags) follows each new revision in every layer — the policy's
//! decisions and the kernel's rules — within `poll_secs`, stamps the revision on what it
//! records, refuses a tampered or replayed bundle while the running policy stays, and starts
//! offline with the last good one.

mod definitions;
mod floor;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolwall_tests::{Daemon, http_unix, is_root, toolwall_bin};

fn toolwall(args: &[&str]) -> std::process::Output {
    Command::new(toolwall_bin())
        .args(args)
        .output()
        .expect("run toolwall")
}

/// `toolwall policy keygen` in `dir`: the secret key file and the public key's text.
fn keypair(dir: &Path) -> (std::path::PathBuf, String) {
    let name = dir.join("fleet");
    let made = toolwall(&["policy", "keygen", name.to_str().unwrap()]);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let public = std::fs::read_to_string(dir.join("fleet.pub")).expect("pub");
    (dir.join("fleet.key"), public)
}

/// `toolwall policy sign` of `policy` at `revision`; the bundle's bytes.
fn sign(dir: &Path, key: &Path, revision: u64, policy: &str) -> Vec<u8> {
    let source = dir.join(format!("policy-{revision}.yaml"));
    let out = dir.join(format!("bundle-{revision}.json"));
    std::fs::write(&source, policy).expect("policy file");
    let signed = toolwall(&[
        "policy",
        "sign",
        "--key",
        key.to_str().unwrap(),
        "--revision",
        &revision.to_string(),
        "--out",
        out.to_str().unwrap(),
        source.to_str().unwrap(),
    ]);
    assert!(
        signed.status.success(),
        "sign: {}",
        String::from_utf8_lossy(&signed.stderr)
    );
    std::fs::read(&out).expect("bundle")
}

#[derive(Default)]
struct Served {
    body: Vec<u8>,
    etag: String,
    /// Each request's `If-None-Match` (empty when absent), and what was answered.
    seen: Vec<(String, u16)>,
}

/// A bundle server: answers every GET with the current bundle, or 304 when the client
/// already has its ETag.
fn serve(listener: TcpListener, served: Arc<Mutex<Served>>) {
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().expect("clone"));
            let mut inm = String::new();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some((name, value)) = line.split_once(':')
                    && name.eq_ignore_ascii_case("if-none-match")
                {
                    inm = value.trim().to_owned();
                }
            }
            let mut served = served.lock().unwrap();
            let answer = if !inm.is_empty() && inm == served.etag {
                served.seen.push((inm, 304));
                format!(
                    "HTTP/1.1 304 Not Modified\r\nETag: {}\r\nConnection: close\r\n\r\n",
                    served.etag
                )
                .into_bytes()
            } else {
                served.seen.push((inm, 200));
                let mut answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nETag: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    served.etag,
                    served.body.len()
                )
                .into_bytes();
                answer.extend_from_slice(&served.body);
                answer
            };
            let _ = stream.write_all(&answer);
        }
    });
}

fn publish(served: &Arc<Mutex<Served>>, body: Vec<u8>, etag: &str) {
    let mut served = served.lock().unwrap();
    served.body = body;
    served.etag = format!("\"{etag}\"");
}

fn health(daemon: &Daemon) -> Value {
    let (status, body) = http_unix(&daemon.socket, "GET", "/health", "").expect("health");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("health JSON")
}

/// Waits until the daemon's `/health` satisfies `done`.
fn wait_health(daemon: &Daemon, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    // poll_secs is 5: a new revision is in force within one poll and the time to apply it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let h = health(daemon);
        if done(&h) {
            return h;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: /health says {:#}\n{}",
            h["policy"],
            daemon.stderr()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The daemon's decision on `tool` of `server` (`/api/check`, as the shims ask it).
fn decide(daemon: &Daemon, server: &str, tool: &str) -> String {
    let (status, body) = http_unix(
        &daemon.socket,
        "POST",
        "/api/check",
        &json!({"server_id": server, "name": tool}).to_string(),
    )
    .expect("check");
    assert_eq!(status, 200, "{body}");
    let decision: Value = serde_json::from_str(&body).expect("decision");
    decision["action"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn publisher_commands_sign_verify_and_refuse() {
    let dir = tempfile::tempdir().expect("dir");
    let name = dir.path().join("fleet");
    let made = toolwall(&["policy", "keygen", name.to_str().unwrap()]);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let key = dir.path().join("fleet.key");
    let public = std::fs::read_to_string(dir.path().join("fleet.pub")).expect("pub");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the secret key is the owner's only");
    // keygen never overwrites a key.
    assert!(
        !toolwall(&["policy", "keygen", name.to_str().unwrap()])
            .status
            .success()
    );

    let bundle = sign(
        dir.path(),
        &key,
        4,
        "sandbox:\n  mcp:\n    deny: ['^get-sum$']\n",
    );
    let file = dir.path().join("bundle-4.json");
    let verified = toolwall(&[
        "policy",
        "verify",
        "--public-key",
        public.trim(),
        file.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&verified.stdout);
    assert!(verified.status.success(), "{stdout}");
    assert!(stdout.contains("revision 4, signature valid"), "{stdout}");

    // One byte of the policy changed: refused, saying why.
    let mut tampered: Value = serde_json::from_slice(&bundle).unwrap();
    tampered["policy"] = "sandbox:\n  mcp:\n    deny: ['^get-summ$']\n".into();
    let bad = dir.path().join("tampered.json");
    std::fs::write(&bad, tampered.to_string()).unwrap();
    let refused = toolwall(&[
        "policy",
        "verify",
        "--public-key",
        public.trim(),
        bad.to_str().unwrap(),
    ]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("signature does not verify"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    // A policy that sets more than sandbox:, or fails the check, is not signed.
    let source = dir.path().join("wide.yaml");
    std::fs::write(&source, "api:\n  listen: 0.0.0.0:9\n").unwrap();
    let wide = toolwall(&[
        "policy",
        "sign",
        "--key",
        key.to_str().unwrap(),
        "--revision",
        "5",
        source.to_str().unwrap(),
    ]);
    assert!(!wide.status.success());
    assert!(
        String::from_utf8_lossy(&wide.stderr).contains("carries only `sandbox:`"),
        "{}",
        String::from_utf8_lossy(&wide.stderr)
    );
}

#[test]
#[ignore = "privileged: needs root and BPF (the kernel's rules follow the bundle); `cargo xtask test` runs it as root"]
fn privileged_a_host_follows_signed_revisions_in_every_layer_and_refuses_bad_ones() {
    assert!(is_root());
    let dir = tempfile::tempdir().expect("dir");
    let (key, public) = keypair(dir.path());

    // Two network servers; each revision denies one of them (the kernel and the policy) and
    // one tool by name (the policy).
    let a = TcpListener::bind("127.0.0.1:0").unwrap();
    let b = TcpListener::bind("127.0.0.1:0").unwrap();
    let (port_a, port_b) = (
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    );
    let servers = format!(
        "sandbox:\n  mcp:\n    servers:\n      - id: alpha\n        type: http\n        url: http://127.0.0.1:{port_a}/mcp\n      - id: beta\n        type: http\n        url: http://127.0.0.1:{port_b}/mcp\n"
    );
    let r1 = sign(
        dir.path(),
        &key,
        1,
        &format!("{servers}    denied_servers: [{{id: beta}}]\n    deny: ['^get-sum$']\n"),
    );
    let r2 = sign(
        dir.path(),
        &key,
        2,
        &format!("{servers}    denied_servers: [{{id: alpha}}]\n    deny: ['^echo$']\n"),
    );

    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://127.0.0.1:{}/bundle.json",
        listener.local_addr().unwrap().port()
    );
    let served = Arc::new(Mutex::new(Served::default()));
    publish(&served, r1.clone(), "r1");
    serve(listener, served.clone());

    let mut daemon = Daemon::start(&format!(
        "policy:\n  bundle:\n    url: {url}\n    public_key: \"{}\"\n    poll_secs: 5\n",
        public.trim()
    ));
    wait_health(&daemon, "revision 1 in force", |h| {
        h["policy"]["revision"] == 1
    });
    assert_eq!(decide(&daemon, "alpha", "get-sum"), "block");
    assert_eq!(decide(&daemon, "alpha", "echo"), "allow");

    // The kernel: what an agent in a session can reach.
    let reach = |daemon: &Daemon, session: &str| -> String {
        let client = format!(
            "import socket\nfor name, port in (('alpha', {port_a}), ('beta', {port_b})):\n    try:\n        socket.create_connection(('127.0.0.1', port), timeout=5).close()\n        print(name, 'connected')\n    except PermissionError:\n        print(name, 'EPERM')\n"
        );
        let out = Command::new(toolwall_bin())
            .args(["exec", "--session", session, "--user", "nobody", "--config"])
            .arg(&daemon.config)
            .args(["--", "/usr/bin/python3", "-c", &client])
            .output()
            .expect("exec");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let under_r1 = reach(&daemon, "bundle-r1");
    assert!(
        under_r1.contains("alpha connected") && under_r1.contains("beta EPERM"),
        "{under_r1}"
    );

    // Revision 2 published: decisions and kernel rules follow within poll_secs.
    publish(&served, r2.clone(), "r2");
    wait_health(&daemon, "revision 2 in force", |h| {
        h["policy"]["revision"] == 2
    });
    assert_eq!(decide(&daemon, "beta", "get-sum"), "allow");
    assert_eq!(decide(&daemon, "beta", "echo"), "block");
    let under_r2 = reach(&daemon, "bundle-r2");
    assert!(
        under_r2.contains("alpha EPERM") && under_r2.contains("beta connected"),
        "{under_r2}"
    );

    // Tampered (revision 3 claimed over revision 2's signature) and replayed (revision 1):
    // refused, reported, and revision 2 stays in force.
    let mut tampered: Value = serde_json::from_slice(&r2).unwrap();
    tampered["revision"] = 3.into();
    tampered["policy"] = format!("{servers}    deny: []\n").into();
    publish(&served, tampered.to_string().into_bytes(), "t3");
    let h = wait_health(&daemon, "the tampered bundle refused", |h| {
        h["policy"]["bundle"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("signature does not verify"))
    });
    assert_eq!(h["policy"]["revision"], 2);
    assert_eq!(decide(&daemon, "beta", "echo"), "block");
    publish(&served, r1.clone(), "r1-again");
    let h = wait_health(&daemon, "the replayed bundle refused", |h| {
        h["policy"]["bundle"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("older than revision 2"))
    });
    assert_eq!(h["policy"]["revision"], 2);
    assert!(
        h["policy"]["bundle"]["refused"].as_u64() >= Some(2),
        "{h:#}"
    );
    assert!(
        daemon.stderr().contains("bundle refused"),
        "{}",
        daemon.stderr()
    );

    // The server saw conditional requests, and answered some with 304.
    publish(&served, r2.clone(), "r2");
    std::thread::sleep(Duration::from_secs(11));
    assert!(
        served
            .lock()
            .unwrap()
            .seen
            .iter()
            .any(|(inm, status)| inm == "\"r2\"" && *status == 304),
        "no conditional GET answered 304: {:?}",
        served.lock().unwrap().seen
    );

    // What the kernel recorded carries the revision that decided it.
    let events = daemon.json_lines(&[
        "mcp",
        "events",
        "--json",
        "--type",
        "mcp_network_connection",
    ]);
    let revision_of = |session: &str, server: &str| {
        events
            .iter()
            .find(|e| {
                e["session_id"] == session && e["server_id"] == server && e["action"] == "block"
            })
            .map(|e| e["policy_revision"].clone())
    };
    assert_eq!(
        revision_of("bundle-r1", "beta"),
        Some(json!(1)),
        "{events:#?}"
    );
    assert_eq!(
        revision_of("bundle-r2", "alpha"),
        Some(json!(2)),
        "{events:#?}"
    );

    // Offline: the server gone, a restart runs revision 2 from the kept bundle.
    served.lock().unwrap().body = b"not a bundle".to_vec();
    served.lock().unwrap().etag = "\"x\"".into();
    assert!(daemon.stop().success());
    daemon.relaunch("stderr-offline");
    let h = health(&daemon);
    assert_eq!(h["policy"]["revision"], 2, "{:#}", h["policy"]);
    assert_eq!(decide(&daemon, "beta", "echo"), "block");
    assert_eq!(decide(&daemon, "beta", "get-sum"), "allow");
    let mut kept = String::new();
    std::fs::File::open(daemon.db.with_file_name("policy-bundle.json"))
        .expect("kept bundle")
        .read_to_string(&mut kept)
        .unwrap();
    assert_eq!(kept.as_bytes(), r2.as_slice());
    drop((a, b));
}
