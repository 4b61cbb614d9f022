//! What the daemon acknowledged is stored: under load, across a shutdown and a `kill -9`, and on a
//! full disk, which is refused loudly.

use super::*;

/// Writers that post batches of 50 events (of `pad` extra bytes each) as fast as they can
/// until one is refused; each returns how many the daemon acknowledged (202) and the first
/// refusal it got.
fn load(
    socket: &Path,
    writers: usize,
    pad: usize,
) -> Vec<std::thread::JoinHandle<(usize, String)>> {
    (0..writers)
        .map(|w| {
            let socket = socket.to_path_buf();
            std::thread::spawn(move || {
                let mut acknowledged = 0usize;
                for batch in 0.. {
                    let body: Vec<String> = (0..50)
                        .map(|i| {
                            let mut line: serde_json::Value =
                                serde_json::from_str(&event_line(w * 1_000_000 + batch * 50 + i))
                                    .expect("event");
                            line["reason"] = "x".repeat(pad).into();
                            line.to_string()
                        })
                        .collect();
                    match http_unix(&socket, "POST", "/api/events", &body.join("\n")) {
                        Ok((202, _)) => acknowledged += 50,
                        Ok((status, body)) => return (acknowledged, format!("{status} {body}")),
                        Err(error) => return (acknowledged, error.to_string()),
                    }
                }
                unreachable!("the loop returns")
            })
        })
        .collect()
}

/// Events in a database, read with `toolwall mcp events --db`.
fn stored_events(db: &Path) -> usize {
    let out = Command::new(toolwall_bin())
        .args(["mcp", "events", "--json", "--limit", "100000000", "--db"])
        .arg(db)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).lines().count()
}

/// Joins [`load`]'s writers and checks the database holds at least what they were told was
/// stored.
fn every_acknowledged_event_is_stored(
    what: &str,
    writers: Vec<std::thread::JoinHandle<(usize, String)>>,
    db: &Path,
) {
    let acknowledged: usize = writers.into_iter().map(|w| w.join().unwrap().0).sum();
    let stored = stored_events(db);
    println!("{what}: {acknowledged} events acknowledged, {stored} stored");
    assert!(acknowledged > 0, "the load ran");
    assert!(
        stored >= acknowledged,
        "every acknowledged event is stored ({stored} < {acknowledged})"
    );
}

#[test]
fn shutdown_under_load_loses_no_acknowledged_event() {
    let mut daemon = Daemon::start("");
    // Four writers; SIGTERM lands in the middle.
    let writers = load(&daemon.socket, 4, 0);
    std::thread::sleep(std::time::Duration::from_millis(700));
    let status = daemon.stop();
    assert!(
        status.success(),
        "exit {status}; stderr:\n{}",
        daemon.stderr()
    );
    every_acknowledged_event_is_stored("shutdown under load", writers, &daemon.db);
}

/// 202 means committed: `kill -9` under load loses no acknowledged event (answering before the
/// commit loses about 1 in 600 of them).
#[test]
fn kill_9_under_load_loses_no_acknowledged_event() {
    let mut daemon = Daemon::start("");
    let writers = load(&daemon.socket, 4, 0);
    std::thread::sleep(std::time::Duration::from_millis(700));
    daemon.kill9();
    every_acknowledged_event_is_stored("kill -9 under load", writers, &daemon.db);
}

/// On a full disk the API must not answer 202 and `/health` "ok" while nothing is stored, nor
/// SIGTERM hang: 503 with the reason, `/health` degraded, every 202 stored, and the stop is
/// prompt.
#[test]
#[ignore = "privileged: needs root to mount a small tmpfs; `cargo xtask test` runs it as root"]
fn privileged_a_full_disk_is_refused_loudly_and_loses_no_acknowledged_event() {
    assert!(is_root());
    let small = tempfile::tempdir().unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=2m", "toolwall-full"])
        .arg(small.path())
        .status()
        .unwrap();
    assert!(mounted.success(), "mount a 2 MiB tmpfs");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(small.path().to_path_buf());
    let db = small.path().join("events.db");
    let mut daemon = Daemon::start_with_db("", db.clone());
    let writers = load(&daemon.socket, 2, 2000);
    let results: Vec<(usize, String)> = writers.into_iter().map(|w| w.join().unwrap()).collect();
    let acknowledged: usize = results.iter().map(|r| r.0).sum();
    println!("full disk: {results:?}");
    for (_, refusal) in &results {
        assert!(
            refusal.starts_with("503") && refusal.contains("cannot write"),
            "refused with the reason: {refusal}"
        );
    }
    let (status, health) = http_unix(&daemon.socket, "GET", "/health", "").unwrap();
    assert_eq!(status, 200);
    let health: serde_json::Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["status"], "degraded", "{health}");
    assert!(
        health["store"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("full")),
        "{health}"
    );
    // A call that could not be recorded does not run (store.on_failure: block, the default);
    // a native tool of the agent is not ours to record and still runs.
    let (status, decision) = http_unix(
        &daemon.socket,
        "POST",
        "/api/check",
        r#"{"server_id":"files","name":"read_file"}"#,
    )
    .unwrap();
    assert_eq!(status, 200, "{decision}");
    let decision: serde_json::Value = serde_json::from_str(&decision).unwrap();
    assert_eq!(decision["action"], "block", "{decision}");
    assert!(
        decision["reason"]
            .as_str()
            .is_some_and(|r| r.contains("event store cannot record")),
        "{decision}"
    );
    let (_, native) =
        http_unix(&daemon.socket, "POST", "/api/check", r#"{"name":"Bash"}"#).unwrap();
    assert!(native.contains(r#""action":"allow""#), "{native}");
    let stopping = std::time::Instant::now();
    let status = daemon.stop();
    let took = stopping.elapsed();
    assert!(
        took < std::time::Duration::from_secs(40),
        "stopped in {took:?}; stderr:\n{}",
        daemon.stderr()
    );
    println!("stop took {took:?}, exit {status}");
    let stored = stored_events(&db);
    println!("full disk: {acknowledged} acknowledged, {stored} stored");
    assert!(acknowledged > 0, "some events fit");
    assert!(
        stored >= acknowledged,
        "every acknowledged event is stored ({stored} < {acknowledged})"
    );
}
