//! A started server's standard error, logged line by line at a bounded length and rate, so a
//! chatty or hostile server cannot flood the daemon's log.

use tokio::io::AsyncReadExt;

/// Longest stderr line logged whole; the rest of a longer one is left out (counted).
const MAX_STDERR_LINE: usize = 4096;

/// Stderr lines logged per second at most; the rest are counted and the count logged.
const STDERR_LINES_PER_SEC: u32 = 50;

/// Logs a server's stderr line by line, in bounded memory: a line longer than
/// [`MAX_STDERR_LINE`] is cut, and past [`STDERR_LINES_PER_SEC`] lines are counted, not logged
/// (a server writing gigabytes must not fill the daemon's memory or its log).
pub(super) async fn log_stderr(server: String, mut stderr: tokio::process::ChildStderr) {
    let mut chunk = vec![0u8; 8192];
    let mut line: Vec<u8> = Vec::with_capacity(MAX_STDERR_LINE);
    let (mut cut, mut logged, mut skipped) = (0usize, 0u32, 0u64);
    let mut second = std::time::Instant::now();
    let mut emit = |line: &mut Vec<u8>, cut: &mut usize| {
        if second.elapsed() >= std::time::Duration::from_secs(1) {
            if skipped > 0 {
                tracing::warn!(%server, skipped, "stderr: lines not logged (more than {STDERR_LINES_PER_SEC} a second)");
            }
            (second, logged, skipped) = (std::time::Instant::now(), 0, 0);
        }
        if logged < STDERR_LINES_PER_SEC {
            logged += 1;
            let text = String::from_utf8_lossy(line);
            if *cut > 0 {
                tracing::info!(%server, "stderr: {text} [{cut} more bytes left out]");
            } else {
                tracing::info!(%server, "stderr: {text}");
            }
        } else {
            skipped += 1;
        }
        line.clear();
        *cut = 0;
    };
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        for piece in chunk[..n].split_inclusive(|&b| b == b'\n') {
            let (body, ends) = match piece.strip_suffix(b"\n") {
                Some(body) => (body, true),
                None => (piece, false),
            };
            let room = MAX_STDERR_LINE - line.len();
            line.extend_from_slice(&body[..body.len().min(room)]);
            cut += body.len().saturating_sub(room);
            if ends {
                emit(&mut line, &mut cut);
            }
        }
    }
    if !line.is_empty() || cut > 0 {
        emit(&mut line, &mut cut);
    }
}
