//! Socket activation (`toolwall.socket`, or a socket unit of the user's for `toolwall
//! mcp-proxy`): `toolwall run` serves the LLM proxy and the API, and `toolwall mcp-proxy` its
//! `--listen` address, on the listening sockets systemd holds for them, so no other process can
//! take those ports while they restart; a socket the configuration does not name stops them,
//! saying which. Driven by systemd's own `systemd-socket-activate`, which holds the ports and
//! execs the program at the first connection, as a socket unit does.

mod mcp_common;

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use toolwall_tests::{free_port, toolwall_bin};

/// The configuration of a daemon whose proxy and API listen on `proxy` and `api`.
fn config(dir: &Path, proxy: u16, api: u16) -> std::path::PathBuf {
    let path = dir.join("toolwall.yaml");
    std::fs::write(
        &path,
        format!(
            "api:\n  listen: 127.0.0.1:{api}\n  socket: {}\nstore:\n  path: {}\nproxy:\n  listen: 127.0.0.1:{proxy}\nnetmon:\n  enabled: false\n",
            dir.join("api.sock").display(),
            dir.join("events.db").display()
        ),
    )
    .expect("write config");
    path
}

/// `systemd-socket-activate` holding `ports`, to exec `toolwall run` at the first connection.
fn activate(config: &Path, ports: &[u16], log: &Path) -> std::process::Child {
    let config = config.display().to_string();
    activate_toolwall(&["run", "--config", &config], ports, log)
}

/// `systemd-socket-activate` holding `ports`, to exec `toolwall ARGS` at the first connection.
fn activate_toolwall(args: &[&str], ports: &[u16], log: &Path) -> std::process::Child {
    let mut cmd = Command::new("systemd-socket-activate");
    for port in ports {
        cmd.arg("-l").arg(format!("127.0.0.1:{port}"));
    }
    cmd.arg(toolwall_bin())
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("log"))
        .spawn()
        .expect("systemd-socket-activate (from systemd)")
}

/// The status line of `GET path` on `port`.
fn get(port: u16, path: &str) -> String {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.lines().next().unwrap_or_default().to_owned()
}

/// Waits until the activator is listening on `port`, at an IPv4 or IPv6 address, without
/// connecting (a connection would start the program it holds the port for).
fn wait_listening(port: u16, child: &mut std::process::Child) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if !mcp_common::listening_sockets(port).is_empty() {
            return;
        }
        assert!(
            child.try_wait().expect("wait").is_none(),
            "systemd-socket-activate ended"
        );
        assert!(std::time::Instant::now() < deadline, "not listening");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_daemon_serves_on_the_ports_systemd_holds() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (proxy, api) = (free_port(), free_port());
    let config = config(dir.path(), proxy, api);
    let log = dir.path().join("daemon.log");
    let mut daemon = activate(&config, &[proxy, api], &log);
    wait_listening(api, &mut daemon);
    // The first connection starts the daemon, which answers it on the socket it was handed.
    let api_answer = get(api, "/health");
    let proxy_answer = get(proxy, "/no-such-route");
    let _ = daemon.kill();
    let _ = daemon.wait();
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        api_answer.starts_with("HTTP/1.1 403"),
        "the API answers on the held port (and wants its web token): {api_answer:?}\n{said}"
    );
    assert!(
        proxy_answer.starts_with("HTTP/1.1 4"),
        "the LLM proxy answers on the held port (and refuses a route it does not know): {proxy_answer:?}\n{said}"
    );
    for port in [proxy, api] {
        assert!(
            said.contains(&format!(
                "listening on the socket systemd holds addr=127.0.0.1:{port}"
            )),
            "{port} taken from systemd, not bound anew:\n{said}"
        );
    }
}

#[test]
fn a_held_port_the_configuration_does_not_name_stops_the_daemon() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (proxy, api, stray) = (free_port(), free_port(), free_port());
    let config = config(dir.path(), proxy, api);
    let log = dir.path().join("daemon.log");
    let mut daemon = activate(&config, &[proxy, api, stray], &log);
    wait_listening(stray, &mut daemon);
    let _ = TcpStream::connect(("127.0.0.1", stray));
    let status = daemon.wait().expect("wait");
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "systemd passed sockets on 127.0.0.1:{stray} that are not the address of proxy.listen or api.listen"
        )),
        "{said}"
    );
}

#[test]
fn the_filter_proxy_serves_on_the_port_systemd_holds() {
    let (_server, upstream) = mcp_common::server_everything_http("streamableHttp");
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let log = dir.path().join("proxy.log");
    let mut proxy = activate_toolwall(
        &["mcp-proxy", "--upstream", &upstream, "--listen", &listen],
        &[port],
        &log,
    );
    wait_listening(port, &mut proxy);
    // The first connection starts the proxy, which answers it on the socket it was handed.
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\nHost: {listen}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    let _ = proxy.kill();
    let _ = proxy.wait();
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains("serverInfo"),
        "the filter proxy initialises a session on the held port: {answer:?}\n{said}"
    );
    assert!(
        said.contains(&format!(
            "listening on the socket systemd holds addr={listen}"
        )),
        "taken from systemd, not bound anew:\n{said}"
    );
}

#[test]
fn a_held_port_the_filter_proxy_does_not_listen_on_stops_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (held, listen) = (free_port(), free_port());
    let log = dir.path().join("proxy.log");
    let listen = format!("127.0.0.1:{listen}");
    let mut proxy = activate_toolwall(
        &[
            "mcp-proxy",
            "--upstream",
            "http://127.0.0.1:9/mcp",
            "--listen",
            &listen,
        ],
        &[held],
        &log,
    );
    wait_listening(held, &mut proxy);
    let _ = TcpStream::connect(("127.0.0.1", held));
    let status = proxy.wait().expect("wait");
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "systemd passed sockets on 127.0.0.1:{held} that are not the address of --listen"
        )),
        "{said}"
    );
}

#[test]
fn a_filter_proxy_that_cannot_bind_its_port_names_who_holds_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let out = Command::new(toolwall_bin())
        .args([
            "mcp-proxy",
            "--upstream",
            "http://127.0.0.1:9/mcp",
            "--listen",
        ])
        .arg(format!("127.0.0.1:{port}"))
        .output()
        .expect("toolwall mcp-proxy");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(&format!("cannot listen on 127.0.0.1:{port} (--listen)"))
            && said.contains(&format!("held by pid {}", std::process::id())),
        "before it asks the upstream anything, the error names who holds the port: {said}"
    );
}

#[test]
fn a_held_socket_on_the_filter_proxys_port_at_another_address_is_named() {
    let dir = tempfile::tempdir().expect("temp dir");
    let port = free_port();
    let log = dir.path().join("proxy.log");
    let listen = format!("127.0.0.1:{port}");
    // `-l PORT` alone: systemd holds [::]:PORT.
    let mut cmd = Command::new("systemd-socket-activate");
    cmd.arg("-l")
        .arg(port.to_string())
        .arg(toolwall_bin())
        .args([
            "mcp-proxy",
            "--upstream",
            "http://127.0.0.1:9/mcp",
            "--listen",
            &listen,
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"));
    let mut proxy = cmd.spawn().expect("systemd-socket-activate");
    wait_listening(port, &mut proxy);
    let _ = TcpStream::connect(("::1", port));
    let status = proxy.wait().expect("wait");
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "systemd passed a socket on [::]:{port}, but --listen is {listen}"
        )),
        "the error names both addresses, not the proxy itself as the port's holder: {said}"
    );
}
