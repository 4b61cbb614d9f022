//! What the kernel reports, as events: each connection, the kernel's summaries, lost events
//! and dropped packets, and the watch's alerts.

use chrono::{DateTime, Utc};

use super::NetmonService;
use crate::{
    decision::Action,
    events::{Event, KernelAlert, NetworkConnection},
    netmon::events::Connect,
};

impl NetmonService {
    /// The id and kind of the server a kernel event names: a rule's endpoint, the session
    /// boundary (kind `boundary`), or for a refused egress the declared stdio server whose
    /// cgroup it came from.
    fn server_of(&self, server_index: u32, cgroup_id: u64) -> (String, String) {
        use agent_common::rule::{HOST_LOCAL_INDEX, LOCAL_NET_INDEX, UNIX_INDEX, UNLISTED_INDEX};
        let boundary = match server_index {
            UNIX_INDEX => Some("toolwall:unix"),
            HOST_LOCAL_INDEX => Some("toolwall:host"),
            LOCAL_NET_INDEX => Some("toolwall:local-network"),
            UNLISTED_INDEX => Some("toolwall:unlisted"),
            _ => None,
        };
        if let Some(id) = boundary {
            return (id.to_owned(), "boundary".to_owned());
        }
        if server_index == agent_common::rule::EGRESS_INDEX {
            let owners = self.egress_owners.read().unwrap_or_else(|e| e.into_inner());
            return (
                owners.get(&cgroup_id).cloned().unwrap_or_default(),
                "stdio".to_owned(),
            );
        }
        let endpoints = self.endpoints.read().unwrap_or_else(|e| e.into_inner());
        endpoints
            .get(server_index as usize)
            .map(|e| (e.id.clone(), e.kind.clone()))
            .unwrap_or_default()
    }

    /// Records a connection: queued when the event queue has room (after what was counted
    /// while it had none), else counted (`backlog.rs`) — the reader never waits, and the
    /// queue never grows past its bound for the kernel's sake.
    pub(super) fn record(&self, event: NetworkConnection) {
        if self.sink.has_room() {
            self.flush_backlog();
            self.sink.emit(Event::McpNetworkConnection(event));
        } else {
            self.backlog
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .add(event);
        }
    }

    /// Queues what was counted while the queue was full, once it has room.
    pub(super) fn flush_backlog(&self) {
        if !self.sink.has_room() {
            return;
        }
        let events = {
            let mut backlog = self.backlog.lock().unwrap_or_else(|e| e.into_inner());
            if backlog.is_empty() {
                return;
            }
            backlog.take()
        };
        for event in events {
            self.sink.emit(event);
        }
    }

    pub(super) fn alert(
        &self,
        session: &str,
        alert: &str,
        detail: String,
        pid: Option<u32>,
        action: Action,
    ) {
        self.sink.emit(Event::KernelAlert(KernelAlert {
            timestamp: Utc::now(),
            session_id: session.to_owned(),
            alert: alert.to_owned(),
            detail,
            pid,
            action,
        }));
    }

    /// Records an `events_lost` alert when the kernel counted ring drops past `reported.0`, and
    /// an `egress_dropped` one when the egress guards dropped packets past `reported.1`.
    pub(super) fn report_drops(&self, reported: &mut (u64, u64), when: &str) {
        let Ok(counters) = self.counters() else {
            return;
        };
        if counters.ring_drops > reported.0 {
            let lost = counters.ring_drops - reported.0;
            let detail = format!(
                "{lost} kernel events did not fit the event ring {when} (their connections were still decided: denied ones refused); {} in all since the programs were loaded",
                counters.ring_drops
            );
            tracing::error!("{detail}");
            self.alert("", "events_lost", detail, None, Action::Allow);
            reported.0 = counters.ring_drops;
        }
        if counters.egress_drops > reported.1 {
            let dropped = counters.egress_drops - reported.1;
            let detail = format!(
                "{dropped} packets of daemon-run stdio servers went to or came from where their declarations' `egress:` does not allow (ICMP, raw or inbound: no connect() to refuse), {when}; dropped"
            );
            tracing::warn!("{detail}");
            self.alert("", "egress_dropped", detail, None, Action::Block);
            reported.1 = counters.egress_drops;
        }
    }

    pub(super) fn to_event(&self, c: &Connect) -> NetworkConnection {
        let (server_id, server_type) = self.server_of(c.raw.server_index, c.raw.cgroup_id);
        let session = self
            .sessions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .name(c.raw.cgroup_id)
            .map(str::to_owned);
        let process = ProcessInfo::of(c.raw.pid);
        NetworkConnection {
            policy_revision: None,
            // When the kernel saw it: an event read late (from a pinned ring a daemon before
            // this one left) keeps its time.
            timestamp: KtimeClock::now().wall(c.raw.ktime_ns),
            session_id: session.unwrap_or_default(),
            remote_addr: c.dest.to_string(),
            server_id,
            server_type,
            action: if c.denied {
                Action::Block
            } else {
                Action::Allow
            },
            pid: c.raw.pid,
            tid: c.raw.tid,
            uid: c.raw.uid,
            comm: c.comm.clone(),
            exe: process.exe,
            cmdline: process.cmdline,
            ppid: process.ppid,
            cgroup_id: c.raw.cgroup_id,
            socket_cookie: c.raw.cookie,
            protocol: protocol_name(c.raw.protocol, c.raw.hook),
            family: family_name(c.raw.family),
            count: 1,
            since: None,
        }
    }

    /// Turns what the kernel summarised since the last report into one event per key
    /// (`count` > 1), and forgets the keys of sessions that are gone once reported.
    pub(super) fn report_summaries(&self) {
        let mut monitor = self.monitor.lock().unwrap_or_else(|e| e.into_inner());
        let summaries = match monitor.summaries() {
            Ok(s) => s,
            Err(error) => {
                tracing::error!(%error, "cannot read the kernel's connection summaries");
                return;
            }
        };
        let clock = KtimeClock::now();
        for (key, summary) in summaries {
            let session = self
                .sessions
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .name(key.cgroup_id)
                .map(str::to_owned);
            let new = summary.summarised.saturating_sub(summary.seen.reported);
            if new > 0 {
                let last = &summary.last;
                let first_ns = if summary.seen.reported == 0 {
                    summary.first_ns
                } else {
                    summary.seen.last_ns
                };
                let (server_id, server_type) = self.server_of(key.server_index, key.cgroup_id);
                let dest = if last.family == agent_common::connect::FAMILY_UNIX {
                    // The name's first sixteen bytes and its length.
                    let len = usize::from(last.port);
                    let shown = crate::netmon::events::unix_name(&last.addr[..len.min(16)]);
                    if len > 16 {
                        format!("{shown}…")
                    } else {
                        shown
                    }
                } else {
                    std::net::SocketAddr::new(crate::netmon::events::dest_ip(&last.addr), last.port)
                        .to_string()
                };
                let comm = String::from_utf8_lossy(
                    last.comm.split(|b| *b == 0).next().unwrap_or_default(),
                )
                .into_owned();
                let event = NetworkConnection {
                    policy_revision: None,
                    timestamp: clock.wall(last.last_ns),
                    session_id: session.clone().unwrap_or_default(),
                    remote_addr: dest,
                    server_id,
                    server_type,
                    action: if key.verdict == agent_common::connect::VERDICT_DENIED {
                        Action::Block
                    } else {
                        Action::Allow
                    },
                    pid: last.pid,
                    tid: 0,
                    uid: last.uid,
                    comm,
                    exe: None,
                    cmdline: None,
                    ppid: None,
                    cgroup_id: key.cgroup_id,
                    socket_cookie: 0,
                    protocol: protocol_name(key.protocol, key.hook),
                    family: family_name(last.family),
                    count: new,
                    since: Some(clock.wall(first_ns)),
                };
                self.record(event);
                let seen = agent_common::summary::SummarySeen {
                    reported: summary.summarised,
                    last_ns: last.last_ns,
                };
                if let Err(error) = monitor.summary_reported(key, seen) {
                    tracing::error!(%error, "cannot record a reported summary; it may be reported again");
                }
            }
            if session.is_none()
                && let Err(error) = monitor.forget_summary(key)
            {
                tracing::warn!(%error, "cannot forget the summary of a session that is gone");
            }
        }
    }
}

fn protocol_name(protocol: u8, hook: u8) -> String {
    match (protocol, hook) {
        (17, agent_common::connect::HOOK_SENDMSG) => "udp-sendmsg".into(),
        (6, agent_common::connect::HOOK_BIND) => "tcp-bind".into(),
        (17, agent_common::connect::HOOK_BIND) => "udp-bind".into(),
        (_, agent_common::connect::HOOK_UNIX_CONNECT) => "unix-connect".into(),
        (_, agent_common::connect::HOOK_UNIX_SEND) => "unix-sendmsg".into(),
        (6, _) => "tcp".into(),
        (17, _) => "udp".into(),
        (n, _) => n.to_string(),
    }
}

fn family_name(family: u16) -> String {
    match family {
        agent_common::connect::FAMILY_INET => "ipv4".into(),
        agent_common::connect::FAMILY_UNIX => "unix".into(),
        _ => "ipv6".into(),
    }
}

/// Wall-clock times of `bpf_ktime_get_ns` values (CLOCK_MONOTONIC), from one reading of both.
struct KtimeClock {
    mono_ns: u64,
    wall: DateTime<Utc>,
}

impl KtimeClock {
    fn now() -> Self {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        KtimeClock {
            mono_ns: ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64,
            wall: Utc::now(),
        }
    }

    fn wall(&self, ktime_ns: u64) -> DateTime<Utc> {
        let ago = self.mono_ns.saturating_sub(ktime_ns);
        self.wall - chrono::Duration::nanoseconds(ago.min(i64::MAX as u64) as i64)
    }
}

/// Most bytes of a process's command line read and kept in a record: the process chooses it
/// (a 1.9 MB command line would make every connection record that large, and reading it whole
/// per connection takes the daemon to hundreds of MB).
const MAX_CMDLINE: u64 = 4096;

/// What procfs still knows about a process (it may have exited already).
#[derive(Debug, Default)]
struct ProcessInfo {
    exe: Option<String>,
    cmdline: Option<String>,
    ppid: Option<u32>,
}

impl ProcessInfo {
    fn of(pid: u32) -> Self {
        let Ok(process) = procfs::process::Process::new(pid as i32) else {
            return Self::default();
        };
        ProcessInfo {
            exe: process.exe().ok().map(|p| p.display().to_string()),
            cmdline: cmdline(pid),
            ppid: process.stat().ok().map(|s| s.ppid as u32),
        }
    }
}

/// The first [`MAX_CMDLINE`] bytes of `pid`'s command line, arguments joined by spaces, saying
/// when it was cut; `None` when it is empty or gone.
fn cmdline(pid: u32) -> Option<String> {
    use std::io::Read as _;
    let file = std::fs::File::open(format!("/proc/{pid}/cmdline")).ok()?;
    let mut raw = Vec::with_capacity(512);
    file.take(MAX_CMDLINE + 1).read_to_end(&mut raw).ok()?;
    let cut = raw.len() as u64 > MAX_CMDLINE;
    raw.truncate(MAX_CMDLINE as usize);
    while raw.last() == Some(&0) {
        raw.pop();
    }
    if raw.is_empty() {
        return None;
    }
    for b in &mut raw {
        if *b == 0 {
            *b = b' ';
        }
    }
    let mut text = String::from_utf8_lossy(&raw).into_owned();
    if cut {
        text.push_str(" …[toolwall: cut at 4096 bytes]");
    }
    Some(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_info_of_this_process_and_of_a_gone_one() {
        let me = ProcessInfo::of(std::process::id());
        assert!(me.exe.is_some() && me.cmdline.is_some() && me.ppid.is_some());
        let gone = ProcessInfo::of(u32::MAX - 1);
        assert!(gone.exe.is_none());
    }
}
