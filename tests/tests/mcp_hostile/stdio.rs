//! The stdio streams: one server process per stream, every case a line on its stdin, the
//! control call after it.

use super::*;

struct StdioSession {
    proc: Proc,
    /// Writes go through a thread, so a server that stops reading cannot block the test.
    stdin: mpsc::Sender<Vec<u8>>,
    lines: mpsc::Receiver<Vec<u8>>,
}

impl StdioSession {
    fn start(stream: &Stream) -> Result<StdioSession, String> {
        let mut argv: Vec<OsString> = Vec::new();
        if stream.toolwall {
            argv.push(toolwall_bin().into());
            argv.extend(["shim", "--deny", DENY, "--"].map(OsString::from));
        }
        argv.extend(stream.sdk.argv(&["stdio".to_owned()]));
        let what = if stream.toolwall { "shim" } else { "server" };
        let mut child = stream
            .command(&argv)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stream.stderr_file(what))
            .spawn()
            .map_err(|e| format!("cannot start {argv:?}: {e}"))?;
        let mut pipe: ChildStdin = child.stdin.take().expect("stdin");
        let (stdin, writes) = mpsc::channel::<Vec<u8>>();
        std::thread::spawn(move || {
            for bytes in writes {
                if pipe.write_all(&bytes).and_then(|()| pipe.flush()).is_err() {
                    break;
                }
            }
        });
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = std::io::BufReader::new(stdout);
            loop {
                let mut line = Vec::new();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        if tx.send(line).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let mut session = StdioSession {
            proc: Proc(child),
            stdin,
            lines,
        };
        let init = initialize_request();
        session.send(format!("{init}\n").as_bytes())?;
        let answer = session.wait_for(&init["id"], START)?;
        if answer["result"]["protocolVersion"].is_null() {
            return Err(format!("initialize was answered with {answer}"));
        }
        session.send(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")?;
        Ok(session)
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), String> {
        self.stdin
            .send(bytes.to_vec())
            .map_err(|_| "its stdin is closed".to_owned())
    }

    /// The next message with this id (other lines are skipped).
    fn wait_for(&self, id: &Value, within: Duration) -> Result<Value, String> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Ok(message) = serde_json::from_slice::<Value>(&line)
                        && message["id"] == *id
                    {
                        return Ok(message);
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    return Err(format!("no answer to id {id} within {within:?}"));
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(format!("stdout closed before an answer to id {id}"));
                }
            }
        }
    }

    /// Sends the case and the control; the control's failure, if any.
    fn case(&mut self, payload: &[u8], n: usize) -> Result<(), String> {
        let mut bytes = payload.to_vec();
        if bytes.last() != Some(&b'\n') {
            bytes.push(b'\n');
        }
        let (id, control) = control_request(n);
        bytes.extend_from_slice(format!("{control}\n").as_bytes());
        self.send(&bytes)?;
        let answer = self.wait_for(&id, CONTROL)?;
        if harmless_answer(&answer) {
            Ok(())
        } else {
            Err(format!("the control was answered with {answer}"))
        }
    }

    fn running(&mut self) -> bool {
        matches!(self.proc.0.try_wait(), Ok(None))
    }
}

pub(crate) fn run_stdio(stream: &Stream, cases: &[(usize, &Case)]) -> (Vec<Outcome>, Vec<String>) {
    let mut outcomes = Vec::new();
    let mut problems = Vec::new();
    let mut session: Option<StdioSession> = None;
    let what = if stream.toolwall { "shim" } else { "server" };
    let mut seen = marker_lines(&stream.marker()).len();
    for &(i, case) in cases {
        trace(stream, case);
        if session.is_none() {
            match StdioSession::start(stream) {
                Ok(s) => session = Some(s),
                Err(e) => {
                    problems.push(format!(
                        "{}: could not start a session before {}: {e}\n{}",
                        stream.label(),
                        case.file,
                        stream.stderr_tail(what)
                    ));
                    return (outcomes, problems);
                }
            }
        }
        let s = session.as_mut().expect("a session");
        let control = s.case(&case.payload, i).err();
        if control.is_some() {
            session = None;
        }
        let lines = marker_after_case(stream, case, seen);
        let new = &lines[seen.min(lines.len())..];
        seen = lines.len();
        let control = control.or_else(|| {
            (!new.iter().any(|l| l == "harmless"))
                .then(|| "the control was answered but `harmless` is not in the marker".into())
        });
        let control = control.map(|e| format!("{e}\n{}", stream.stderr_tail(what)));
        outcomes.push(Outcome {
            case: i,
            secret_runs: new.iter().filter(|l| *l == "secret").count(),
            control,
        });
    }
    if let Some(s) = session.as_mut()
        && !s.running()
    {
        problems.push(format!(
            "{}: not running after the last case",
            stream.label()
        ));
    }
    (outcomes, problems)
}
