//! A host with no bundle kept refuses any revision below `min_revision`, a replayed old one
//! included.

use super::*;

/// A host with no bundle kept must not take any validly signed revision, a replayed old one
/// included: `min_revision` is the floor for a new host (and the kept one's revision after).
#[test]
fn a_new_host_refuses_a_revision_below_its_floor() {
    let dir = tempfile::tempdir().expect("dir");
    let (key, public) = keypair(dir.path());
    let old = sign(dir.path(), &key, 1, "sandbox:\n  mcp:\n    deny: []\n");
    let current = sign(
        dir.path(),
        &key,
        2,
        "sandbox:\n  mcp:\n    deny: ['^echo$']\n",
    );
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://127.0.0.1:{}/b.json",
        listener.local_addr().unwrap().port()
    );
    let served = Arc::new(Mutex::new(Served::default()));
    publish(&served, old, "r1");
    serve(listener, served.clone());
    let daemon = Daemon::start(&format!(
        "policy:\n  bundle:\n    url: {url}\n    public_key: \"{}\"\n    poll_secs: 5\n    min_revision: 2\n",
        public.trim()
    ));
    let h = wait_health(&daemon, "revision 1 refused", |h| {
        h["policy"]["bundle"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("oldest this host takes"))
    });
    assert_eq!(h["policy"]["revision"], Value::Null);
    assert_eq!(
        decide(&daemon, "s", "echo"),
        "allow",
        "the file's policy runs"
    );
    publish(&served, current, "r2");
    wait_health(&daemon, "revision 2 in force", |h| {
        h["policy"]["revision"] == 2
    });
    assert_eq!(decide(&daemon, "s", "echo"), "block");

    // A revision that changes `approval:` is not refused (refused, it would be refused for
    // ever: nothing is kept, so a restart would not help). Its rules apply at once; its
    // approval settings at the restart.
    let approval = sign(
        dir.path(),
        &key,
        3,
        "sandbox:\n  mcp:\n    deny: ['^get-sum$']\n    approval:\n      timeout_secs: 30\n",
    );
    publish(&served, approval, "r3");
    let h = wait_health(&daemon, "revision 3 in force", |h| {
        h["policy"]["revision"] == 3
    });
    assert_eq!(
        h["policy"]["bundle"]["restart_needed_for"], "sandbox.mcp.approval",
        "{h:#}"
    );
    assert_eq!(decide(&daemon, "s", "get-sum"), "block");
    assert_eq!(decide(&daemon, "s", "echo"), "allow");

    // A floor raised past the kept revision retires it, at start and when served.
    let mut daemon = daemon;
    assert!(daemon.stop().success());
    let text = std::fs::read_to_string(&daemon.config).unwrap();
    std::fs::write(
        &daemon.config,
        text.replace("min_revision: 2", "min_revision: 4"),
    )
    .unwrap();
    daemon.relaunch("stderr-floor");
    let h = wait_health(&daemon, "revision 3 refused under the new floor", |h| {
        h["policy"]["bundle"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("oldest this host takes"))
    });
    assert_eq!(h["policy"]["revision"], Value::Null, "{h:#}");
    let said = std::fs::read_to_string(daemon.dir.path().join("stderr-floor")).unwrap_or_default();
    assert!(
        said.contains("older than policy.bundle.min_revision"),
        "{said}"
    );
}
