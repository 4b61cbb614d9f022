//! The soak: every layer under load for `TOOLWALL_SOAK_MINUTES`, the daemon killed (`kill -9`)
//! halfway and started again, and then every call the clients made accounted for in the record.
//!
//! Three clients run at once until the deadline: an agent on the official Anthropic SDK
//! (streamed) and one on the OpenAI SDK (buffered), each under `toolwall exec` in a session of
//! its own, and a client on the host calling through `toolwall mcp-proxy --config`. Each agent
//! round asks the fake model, which proposes an allowed call on a stdio server (run through
//! `toolwall shim`), a denied one, and an allowed call on a network server (seen by the kernel);
//! every call's arguments carry the round's tag, so each record says which call it is.
//!
//! The accounting, for every round the client saw complete: exactly one record per call, of the
//! kind the layers that saw it make (joined, refused at the model, executed through the proxy,
//! connected through the kernel), with every sighting of a record carrying the same call's
//! arguments. For a round the kill cut short: at most one record per call. And across the store:
//! every call event is a sighting of exactly one record, and no row is unreadable.
//!
//! `cargo xtask soak --minutes N` runs it; `cargo xtask test` runs it for two minutes. With
//! `TOOLWALL_SOAK_DUMP=DIR` it writes what it read into DIR.

mod mcp_common;

use std::{
    collections::{BTreeMap, HashMap},
    process::Command,
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use toolwall_tests::{
    Daemon, fake_model, free_port, is_root, python, server_everything, toolwall_bin, workspace_root,
};

/// The agents' sessions, by their dialect.
const AGENTS: &[(&str, &str)] = &[("anthropic", "soak-a"), ("openai", "soak-o")];
/// The host client's tag prefix.
const HOST: &str = "soak-h";

fn minutes() -> f64 {
    let value = std::env::var("TOOLWALL_SOAK_MINUTES").expect(
        "TOOLWALL_SOAK_MINUTES is not set: run the soak with `cargo xtask soak --minutes N`",
    );
    value
        .parse()
        .unwrap_or_else(|_| panic!("TOOLWALL_SOAK_MINUTES={value:?} is not a number of minutes"))
}

/// The calls the fake model proposes for the round whose user message is `tag`: the denied
/// `get-sum` carries the tag as a string argument the server would refuse, but the policy
/// refuses it first.
fn proposals(tag: &str) -> Vec<fake_model::ToolCall> {
    vec![
        ("mcp__everything__echo".into(), json!({"message": tag})),
        ("mcp__everything__get-sum".into(), json!({"a": tag, "b": 1})),
        ("mcp__netev__echo".into(), json!({"message": tag})),
    ]
}

/// Starts one client: `soak_agent.py MODE NAME SECONDS ...`, under `toolwall exec` in session
/// `name` for the agents, directly for the host client.
fn spawn_client(
    daemon: &Daemon,
    mode: &str,
    name: &str,
    seconds: f64,
    net_url: &str,
) -> std::process::Child {
    let mut command = if mode == "host" {
        Command::new(python())
    } else {
        let mut c = Command::new(toolwall_bin());
        c.args(["exec", "--as-root", "--session", name, "--config"])
            .arg(&daemon.config)
            .arg("--")
            .arg(python());
        c
    };
    command
        .arg(workspace_root().join("tests/peers/soak_agent.py"))
        .args([mode, name, &seconds.to_string()])
        .arg(toolwall_bin())
        .arg(&daemon.config)
        .arg(server_everything())
        .arg(net_url)
        .stdout(std::process::Stdio::piped())
        // A file, not a pipe read only at the end: a full pipe would stop every process
        // writing to it (the clients' shims and filter proxies log there too).
        .stderr(std::fs::File::create(stderr_file(daemon, name)).expect("a client's stderr file"))
        .spawn()
        .expect("start a soak client")
}

fn stderr_file(daemon: &Daemon, name: &str) -> std::path::PathBuf {
    daemon.dir.path().join(format!("{name}.stderr"))
}

/// A client's report: its rounds, each `{n, model, tool_uses, calls}`.
fn report(daemon: &Daemon, name: &str, child: std::process::Child) -> Vec<Value> {
    let out = child.wait_with_output().expect("wait for a soak client");
    let stderr = std::fs::read_to_string(stderr_file(daemon, name)).unwrap_or_default();
    if let Ok(dir) = std::env::var("TOOLWALL_SOAK_DUMP") {
        let _ = std::fs::write(format!("{dir}/{name}.stderr"), &stderr);
    }
    // `toolwall exec` says so, and exits 1, when the daemon went away while its agent ran.
    let told = stderr.contains(
        "the daemon went away while the agent ran (agent's exit: exit status: 0); exiting 1",
    );
    assert!(
        out.status.success() || (told && out.status.code() == Some(1)),
        "soak client {name} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        stderr
    );
    let report: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("soak client {name} printed no JSON report ({e})"));
    report["rounds"].as_array().expect("rounds").clone()
}

/// The tag a call event's arguments carry (`message`, or `a` of the denied call); for a call
/// the LLM layer refused by its name alone in a stream (its arguments were never read), the tag
/// of a call of the same model answer (`request_id`).
fn tag_of(event: &Value, siblings: &HashMap<&str, String>) -> Option<String> {
    let input = &event["input"];
    input["message"]
        .as_str()
        .or_else(|| input["a"].as_str())
        .map(str::to_owned)
        .or_else(|| siblings.get(event["request_id"].as_str()?).cloned())
}

/// With `TOOLWALL_SOAK_DUMP=DIR`, writes what the soak read (events, records, the clients'
/// rounds) as JSON files into DIR, to look into a failed run.
fn dump(read: &[(&str, &Vec<Value>)], rounds: &BTreeMap<String, Vec<Value>>) {
    let Ok(dir) = std::env::var("TOOLWALL_SOAK_DUMP") else {
        return;
    };
    let write = |name: &str, value: String| {
        let path = format!("{dir}/{name}.json");
        std::fs::write(&path, value).unwrap_or_else(|e| panic!("write {path}: {e}"));
    };
    for (name, values) in read {
        write(name, Value::from(values.to_vec()).to_string());
    }
    write("rounds", json!(rounds).to_string());
}

/// Whether every step of a round succeeded.
fn round_complete(round: &Value) -> bool {
    (round["model"] == "ok" || round["model"] == "none")
        && round["calls"]
            .as_object()
            .is_some_and(|calls| calls.values().all(|v| v == "ok"))
}

/// What one call of one round should have left in the record.
struct Expected {
    /// The record's `server_id/tool`.
    call: String,
    /// The round's tag.
    tag: String,
    /// Whether the client saw the call complete (then its record must be there, and whole).
    complete: bool,
    /// The record's kind and action when complete.
    kind: &'static str,
    action: &'static str,
    /// Whether a complete call's record carries the kernel's sighting of its connection.
    connection: bool,
}

fn expectations(rounds: &BTreeMap<String, Vec<Value>>) -> Vec<Expected> {
    let mut out = Vec::new();
    for (name, rounds) in rounds {
        for round in rounds {
            let tag = format!("{name}-{}", round["n"]);
            let calls = &round["calls"];
            if name == HOST {
                out.push(Expected {
                    call: "netev/echo".into(),
                    complete: calls["echo"] == "ok",
                    tag,
                    kind: "execution_only",
                    action: "allow",
                    connection: false,
                });
                continue;
            }
            let answered = round["model"] == "ok";
            if answered {
                assert_eq!(
                    round["tool_uses"],
                    json!(["mcp__everything__echo", "mcp__netev__echo"]),
                    "{name}: the denied call reached the agent, or an allowed one did not: {round}"
                );
            }
            let ran = |tool: &str| calls[tool] == "ok";
            out.push(Expected {
                call: "everything/echo".into(),
                tag: tag.clone(),
                complete: ran("mcp__everything__echo"),
                kind: "joined",
                action: "allow",
                connection: false,
            });
            out.push(Expected {
                call: "everything/get-sum".into(),
                tag: tag.clone(),
                complete: answered,
                kind: "intercept_only",
                action: "block",
                connection: false,
            });
            out.push(Expected {
                call: "netev/echo".into(),
                tag,
                complete: ran("mcp__netev__echo"),
                kind: "intercept_only",
                action: "allow",
                connection: true,
            });
        }
    }
    out
}

#[test]
#[ignore = "soak: `cargo xtask soak --minutes N` runs it (root, BPF); `cargo xtask test` for two minutes"]
fn soak_every_call_is_accounted_for_across_layers_and_a_kill() {
    assert!(is_root());
    let seconds = minutes() * 60.0;
    let llm = fake_model::start(|_, request| proposals(fake_model::last_message(request)));
    let (_net_server, net_url) = mcp_common::server_everything_http("streamableHttp");
    // A fixed proxy port: the agents keep the base URL `toolwall exec` gave them across the kill.
    let mut daemon = Daemon::start(&format!(
        r#"proxy:
  listen: 127.0.0.1:{port}
  providers:
    anthropic: {llm}
    openai: {llm}
sandbox:
  mcp:
    deny: ["^get-sum$"]
    servers:
      - id: everything
        type: stdio
        command: {everything}
        args: [stdio]
      - id: netev
        type: http
        url: {net_url}
"#,
        port = free_port(),
        everything = server_everything().display()
    ));

    let started = Instant::now();
    let mut clients: Vec<(String, std::process::Child)> = AGENTS
        .iter()
        .map(|(mode, name)| {
            (
                name.to_string(),
                spawn_client(&daemon, mode, name, seconds, &net_url),
            )
        })
        .collect();
    clients.push((
        HOST.into(),
        spawn_client(&daemon, "host", HOST, seconds, &net_url),
    ));

    std::thread::sleep(Duration::from_secs_f64(seconds / 2.0));
    println!("soak: kill -9 of the daemon after {:?}", started.elapsed());
    daemon.kill9();
    daemon.relaunch("stderr-after-kill");
    println!("soak: daemon back after {:?}", started.elapsed());

    let rounds: BTreeMap<String, Vec<Value>> = clients
        .into_iter()
        .map(|(name, child)| {
            let rounds = report(&daemon, &name, child);
            (name, rounds)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(3000)); // past the correlation window

    let events = daemon.json_lines(&["mcp", "events", "--json"]);
    let records = daemon.json_lines(&["mcp", "calls", "--json"]);
    dump(&[("events", &events), ("records", &records)], &rounds);
    let by_id: HashMap<i64, &Value> = events
        .iter()
        .map(|e| (e["id"].as_i64().expect("an event id"), e))
        .collect();
    let unreadable = events
        .iter()
        .filter(|e| e["type"] == "unreadable_row")
        .count();
    assert_eq!(unreadable, 0, "unreadable rows after the kill");

    let siblings: HashMap<&str, String> = events
        .iter()
        .filter_map(|e| {
            Some((
                e["request_id"].as_str()?,
                e["input"]["message"].as_str()?.to_owned(),
            ))
        })
        .collect();
    // Every record's call sightings carry one call's arguments: the join is right.
    let mut found: HashMap<(String, String), Vec<&Value>> = HashMap::new();
    let mut sighted: HashMap<i64, usize> = HashMap::new();
    for record in &records {
        let mut tags = Vec::new();
        for layer in ["intercept", "execution", "connection"] {
            let Some(id) = record[layer]["event_id"].as_i64() else {
                continue;
            };
            *sighted.entry(id).or_default() += 1;
            if layer != "connection" {
                let event = by_id.get(&id).unwrap_or_else(|| {
                    panic!("record names event {id}, which the store lacks: {record}")
                });
                tags.push(tag_of(event, &siblings));
            }
        }
        let Some(Some(tag)) = tags.first().cloned() else {
            continue; // a connection alone: the SDK's other connections, no call
        };
        assert!(
            tags.iter().all(|t| t.as_deref() == Some(&tag)),
            "one record joins sightings of different calls: {record}"
        );
        let call = format!(
            "{}/{}",
            record["server_id"].as_str().unwrap_or(""),
            record["tool"].as_str().unwrap_or("")
        );
        found.entry((call, tag)).or_default().push(record);
    }
    let call_events: Vec<i64> = events
        .iter()
        .filter(|e| e["type"] == "mcp_tool_call_intercepted" || e["type"] == "mcp_tool_called")
        .map(|e| e["id"].as_i64().unwrap_or_default())
        .collect();
    for (id, times) in &sighted {
        assert_eq!(
            *times,
            1,
            "event {id} is a sighting of {times} records: {}",
            by_id.get(id).map_or(Value::Null, |e| (*e).clone())
        );
    }
    for id in &call_events {
        assert_eq!(
            sighted.get(id).copied().unwrap_or(0),
            1,
            "call event {id} is a sighting of {} records: {}",
            sighted.get(id).copied().unwrap_or(0),
            by_id[id]
        );
    }

    let expected = expectations(&rounds);
    let mut tally: BTreeMap<String, [usize; 3]> = BTreeMap::new(); // complete, cut and recorded, cut and absent
    for e in &expected {
        let got = found
            .remove(&(e.call.clone(), e.tag.clone()))
            .unwrap_or_default();
        assert!(
            got.len() <= 1,
            "{} {}: {} records: {got:#?}",
            e.call,
            e.tag,
            got.len()
        );
        let counts = tally.entry(format!("{} {}", e.call, e.kind)).or_default();
        if !e.complete {
            counts[if got.is_empty() { 2 } else { 1 }] += 1;
            continue;
        }
        counts[0] += 1;
        let record = got.first().unwrap_or_else(|| {
            panic!(
                "{} {}: the client saw it complete, the record lacks it",
                e.call, e.tag
            )
        });
        assert_eq!(record["kind"], e.kind, "{} {}: {record}", e.call, e.tag);
        assert_eq!(record["action"], e.action, "{} {}: {record}", e.call, e.tag);
        if e.connection {
            assert_eq!(
                record["connection"]["layer"], "kernel",
                "{} {}: no kernel sighting: {record}",
                e.call, e.tag
            );
        }
    }
    assert!(
        found.is_empty(),
        "records of calls no client made: {found:#?}"
    );

    let total_rounds: usize = rounds.values().map(Vec::len).sum();
    println!(
        "soak: {} minutes, {total_rounds} rounds, {} events, {} records",
        minutes(),
        events.len(),
        records.len()
    );
    for (name, rounds) in &rounds {
        let cut = rounds.iter().filter(|r| !round_complete(r)).count();
        println!(
            "soak: {name}: {} rounds, {cut} cut by the kill",
            rounds.len()
        );
        // The kill cuts the rounds in flight and those until the daemon is back, no more.
        assert!(
            rounds.len() >= 10 && cut * 4 <= rounds.len(),
            "{name}: {cut} of {} rounds failed: {rounds:#?}",
            rounds.len()
        );
    }
    for (what, [complete, cut_recorded, cut_absent]) in &tally {
        println!(
            "soak: {what:<40} {complete:>6} complete, {cut_recorded} cut and recorded, {cut_absent} cut and absent"
        );
    }
    assert!(daemon.stop().success());
}
