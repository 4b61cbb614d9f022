//! The Streamable HTTP streams: the server (or the filter proxy in front of it) on a port, every
//! case a POST in the session, read with a raw client that sends the bytes as the case has them.

use super::*;

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The JSON-RPC messages of a JSON or SSE body.
    fn messages(&self) -> Vec<Value> {
        let text = String::from_utf8_lossy(&self.body);
        let trimmed = text.trim_start();
        if trimmed.starts_with('{') || trimmed.starts_with('[') {
            return match serde_json::from_str::<Value>(trimmed) {
                Ok(Value::Array(items)) => items,
                Ok(v) => vec![v],
                Err(_) => vec![],
            };
        }
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .collect()
    }
}

/// The body of a chunked message, and whether its last chunk came.
fn dechunk(mut body: &[u8]) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    loop {
        let Some(eol) = body.windows(2).position(|w| w == b"\r\n") else {
            return (out, false);
        };
        let size = std::str::from_utf8(&body[..eol])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok());
        let Some(size) = size else {
            return (out, false);
        };
        body = &body[eol + 2..];
        if size == 0 {
            return (out, true);
        }
        let take = size.min(body.len());
        out.extend_from_slice(&body[..take]);
        if take < size {
            return (out, false);
        }
        body = &body[take..];
        body = body.strip_prefix(b"\r\n").unwrap_or(body);
    }
}

/// The response in `raw` once it is complete (by `Content-Length`, the last chunk, or `eof`).
fn parse_response(raw: &[u8], eof: bool) -> Option<Response> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let mut response = Response {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    };
    if response
        .header("transfer-encoding")
        .is_some_and(|v| v.eq_ignore_ascii_case("chunked"))
    {
        let (body, last) = dechunk(&response.body);
        response.body = body;
        return (last || eof).then_some(response);
    }
    if let Some(length) = response.header("content-length") {
        let length: usize = length.parse().unwrap_or(0);
        return (response.body.len() >= length || eof).then(|| {
            response.body.truncate(length);
            response
        });
    }
    (eof || status == 202 || status == 204).then_some(response)
}

/// One HTTP/1.1 request (`Connection: close`) to 127.0.0.1:PORT/mcp. Reads until the server
/// closes or `within` passes (`partial` then says whether what came so far is an answer).
fn http(
    port: u16,
    method: &str,
    headers: &[(String, String)],
    body: &[u8],
    within: Duration,
    partial: bool,
) -> Result<Response, String> {
    let deadline = Instant::now() + within;
    let mut conn = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), within)
        .map_err(|e| format!("connect: {e}"))?;
    conn.set_write_timeout(Some(within)).expect("write timeout");
    let mut head = format!(
        "{method} /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes())
        .and_then(|()| conn.write_all(body))
        .map_err(|e| format!("send: {e}"))?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16384];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            if partial && let Some(r) = parse_response(&raw, true) {
                return Ok(r);
            }
            return Err(format!(
                "no complete answer within {within:?}: {:?}",
                String::from_utf8_lossy(&raw[..raw.len().min(2000)])
            ));
        }
        conn.set_read_timeout(Some(left.min(Duration::from_millis(200))))
            .expect("read timeout");
        match conn.read(&mut buf) {
            Ok(0) => {
                return parse_response(&raw, true)
                    .ok_or_else(|| format!("no HTTP answer: {:?}", String::from_utf8_lossy(&raw)));
            }
            Ok(n) => {
                raw.extend_from_slice(&buf[..n]);
                if let Some(r) = parse_response(&raw, false) {
                    return Ok(r);
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => {
                return parse_response(&raw, true).ok_or_else(|| format!("read: {e}"));
            }
        }
    }
}

fn base_headers() -> Vec<(String, String)> {
    vec![
        ("content-type".into(), "application/json".into()),
        (
            "accept".into(),
            "application/json, text/event-stream".into(),
        ),
    ]
}

/// `base` with `overrides` replacing (an empty value: dropping) headers of the same name.
fn with_headers(
    base: &[(String, String)],
    overrides: &[(String, String)],
) -> Vec<(String, String)> {
    let mut out: Vec<_> = base
        .iter()
        .filter(|(k, _)| !overrides.iter().any(|(o, _)| o == k))
        .cloned()
        .collect();
    out.extend(overrides.iter().filter(|(_, v)| !v.is_empty()).cloned());
    out
}

/// A normal session; its headers.
fn http_session(port: u16) -> Result<Vec<(String, String)>, String> {
    let init = initialize_request();
    let answer = http(
        port,
        "POST",
        &base_headers(),
        init.to_string().as_bytes(),
        START,
        false,
    )?;
    let ok = answer
        .messages()
        .iter()
        .any(|m| m["id"] == init["id"] && !m["result"]["protocolVersion"].is_null());
    let Some(session) = answer.header("mcp-session-id").filter(|_| ok) else {
        return Err(format!(
            "initialize was answered {} {:?}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        ));
    };
    let mut headers = base_headers();
    headers.push(("mcp-session-id".into(), session.to_owned()));
    headers.push(("mcp-protocol-version".into(), PROTOCOL.into()));
    let note = http(
        port,
        "POST",
        &headers,
        br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
        CONTROL,
        false,
    )?;
    if note.status != 202 {
        return Err(format!(
            "notifications/initialized was answered {}",
            note.status
        ));
    }
    Ok(headers)
}

/// Sends the case on the session (opening one first if there is none), then the control; the
/// control's failure, if any (the session is then dropped).
fn http_case(
    port: u16,
    session: &mut Option<Vec<(String, String)>>,
    case: &Case,
    n: usize,
) -> Result<(), String> {
    let headers = match session.take() {
        Some(headers) => headers,
        None => http_session(port)?,
    };
    // Whatever the server makes of the hostile body; it may refuse it or never finish answering.
    let _ = http(
        port,
        "POST",
        &with_headers(&headers, &case.headers),
        &case.payload,
        PAYLOAD,
        true,
    );
    let (id, control) = control_request(n);
    let answer = http(
        port,
        "POST",
        &headers,
        control.to_string().as_bytes(),
        CONTROL,
        false,
    )?;
    if answer
        .messages()
        .iter()
        .any(|m| m["id"] == id && harmless_answer(m))
    {
        *session = Some(headers);
        Ok(())
    } else {
        Err(format!(
            "the control was answered {} {:?}",
            answer.status,
            String::from_utf8_lossy(&answer.body)
        ))
    }
}

fn start_http(stream: &Stream) -> Result<(Proc, Option<Proc>, u16), String> {
    // The server's port may be taken between choosing and binding it: tried on another.
    let (server, port) = try_start_listening(&stream.server(), |port| {
        stream
            .command(&stream.sdk.argv(&["http".to_owned(), port.to_string()]))
            .stderr(stream.stderr_file("server"))
            .spawn()
            .map(Proc)
            .map_err(|e| format!("cannot start the server: {e}"))
    })?;
    if !stream.toolwall {
        return Ok((server, None, port));
    }
    // The proxy's port may be taken between choosing and binding it: tried on another.
    let (proxy, listen) = try_start_listening("toolwall mcp-proxy", |listen| {
        Command::new(toolwall_bin())
            .args(["mcp-proxy", "--upstream"])
            .arg(format!("http://127.0.0.1:{port}/mcp"))
            .arg("--listen")
            .arg(format!("127.0.0.1:{listen}"))
            .args(["--deny", DENY])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stream.stderr_file("proxy"))
            .spawn()
            .map(Proc)
            .map_err(|e| format!("cannot start toolwall mcp-proxy: {e}"))
    })?;
    Ok((server, Some(proxy), listen))
}

pub(crate) fn run_http(stream: &Stream, cases: &[(usize, &Case)]) -> (Vec<Outcome>, Vec<String>) {
    let mut outcomes = Vec::new();
    let mut problems = Vec::new();
    let what = if stream.toolwall { "proxy" } else { "server" };
    let (mut server, mut proxy, port) = match start_http(stream) {
        Ok(started) => started,
        Err(e) => {
            problems.push(format!("{}: {e}", stream.label()));
            return (outcomes, problems);
        }
    };
    let mut seen = marker_lines(&stream.marker()).len();
    let mut session = None;
    for &(i, case) in cases {
        trace(stream, case);
        let control = http_case(port, &mut session, case, i).err();
        let lines = marker_after_case(stream, case, seen);
        let new = &lines[seen.min(lines.len())..];
        seen = lines.len();
        let control = control.or_else(|| {
            (!new.iter().any(|l| l == "harmless"))
                .then(|| "the control was answered but `harmless` is not in the marker".into())
        });
        outcomes.push(Outcome {
            case: i,
            secret_runs: new.iter().filter(|l| *l == "secret").count(),
            control: control.map(|e| format!("{e}\n{}", stream.stderr_tail(what))),
        });
    }
    for (p, name) in [
        (Some(&mut server), "the server"),
        (proxy.as_mut(), "toolwall"),
    ] {
        if let Some(p) = p
            && !matches!(p.0.try_wait(), Ok(None))
        {
            problems.push(format!(
                "{}: {name} is not running after the last case",
                stream.label()
            ));
        }
    }
    (outcomes, problems)
}
