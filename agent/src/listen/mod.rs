//! The TCP listeners toolwall serves on (the daemon's LLM proxy and API, `toolwall mcp-proxy`):
//! taken from systemd when it holds them (socket activation, [`Activated`]), else bound here,
//! and when the port is taken, an error that names who holds it.

mod activation;

pub(crate) use activation::Activated;

/// Who listens on `port`, for the error of a listener that could not bind it: ` (held by pid
/// 812 (python3) in cgroup /toolwall/review, user alice)`, or nothing when no listener is seen.
pub(crate) fn held_by(port: u16) -> String {
    if port == 0 {
        return String::new();
    }
    let holders = match crate::sockdiag::port_holders(port) {
        Ok(holders) if !holders.is_empty() => holders,
        _ => return String::new(),
    };
    let words: Vec<String> = holders
        .iter()
        .map(|h| {
            let user = crate::exec::user_name(h.uid).unwrap_or_else(|| h.uid.to_string());
            if h.processes.is_empty() {
                return format!("a socket of user {user} no process here holds");
            }
            let processes: Vec<String> = h
                .processes
                .iter()
                .map(|(pid, comm, cgroup)| format!("pid {pid} ({comm}) in cgroup {cgroup}"))
                .collect();
            format!("{}, user {user}", processes.join(", "))
        })
        .collect();
    format!(" (held by {})", words.join("; "))
}
