//! Kernel connection events while the store is behind (queued one by one, a session's
//! connects, each carrying its process's command line, take the queue to gigabytes): they are
//! counted per (session, server, destination, verdict, protocol) — the record a summary the
//! kernel makes under flood looks like — and stored as such once the queue has room. Nothing
//! is queued past the bound; what even the counts cannot hold is itself recorded.

use std::collections::HashMap;

use crate::decision::Action;
use crate::events::{Event, KernelAlert, NetworkConnection};

/// Most keys counted at once; connections of further keys are only counted in all.
const MAX_KEYS: usize = 4096;

type Key = (String, String, String, Action, String);

/// Connections waiting for room in the event queue.
#[derive(Debug, Default)]
pub(super) struct Backlog {
    counted: HashMap<Key, NetworkConnection>,
    /// Connections of keys past [`MAX_KEYS`].
    uncounted: u64,
}

impl Backlog {
    /// Counts `c` under its key; the newest connection's process stands for the key.
    pub(super) fn add(&mut self, mut c: NetworkConnection) {
        let key = (
            c.session_id.clone(),
            c.server_id.clone(),
            c.remote_addr.clone(),
            c.action,
            c.protocol.clone(),
        );
        if let Some(seen) = self.counted.get_mut(&key) {
            let since = seen
                .since
                .unwrap_or(seen.timestamp)
                .min(c.since.unwrap_or(c.timestamp));
            c.count += seen.count;
            c.since = Some(since);
            *seen = c;
        } else if self.counted.len() < MAX_KEYS {
            c.since.get_or_insert(c.timestamp);
            self.counted.insert(key, c);
        } else {
            self.uncounted += c.count;
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.counted.is_empty() && self.uncounted == 0
    }

    /// The counted connections as events (each with its `count` and `since`), and an
    /// `events_lost` alert for those that could not be counted under a key.
    pub(super) fn take(&mut self) -> Vec<Event> {
        let mut events: Vec<Event> = self
            .counted
            .drain()
            .map(|(_, c)| Event::McpNetworkConnection(c))
            .collect();
        if self.uncounted > 0 {
            events.push(Event::KernelAlert(KernelAlert {
                timestamp: chrono::Utc::now(),
                session_id: String::new(),
                alert: "events_lost".into(),
                detail: format!(
                    "{} kernel connection events arrived while the event store was behind and {MAX_KEYS} (session, server, destination) keys were already being counted: not recorded one by one (their connections were still decided: denied ones refused)",
                    self.uncounted
                ),
                pid: None,
                action: Action::Allow,
            }));
            self.uncounted = 0;
        }
        events
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connection(dest: &str, action: Action, second: i64) -> NetworkConnection {
        NetworkConnection {
            policy_revision: None,
            timestamp: chrono::DateTime::from_timestamp(1_800_000_000 + second, 0).expect("time"),
            session_id: "s".into(),
            remote_addr: dest.into(),
            server_id: "net".into(),
            server_type: "http".into(),
            action,
            pid: second as u32,
            tid: 0,
            uid: 0,
            comm: "python3".into(),
            exe: None,
            cmdline: None,
            ppid: None,
            cgroup_id: 1,
            socket_cookie: 0,
            protocol: "tcp".into(),
            family: "ipv4".into(),
            count: 1,
            since: None,
        }
    }

    #[test]
    fn connections_are_counted_per_key_with_first_and_last_time() {
        let mut backlog = Backlog::default();
        for second in 0..1000 {
            backlog.add(connection("127.0.0.1:1", Action::Block, second));
        }
        backlog.add(connection("127.0.0.1:1", Action::Allow, 5));
        let events = backlog.take();
        assert!(backlog.is_empty());
        let mut counts: Vec<(Action, u64, Option<i64>, i64)> = events
            .iter()
            .map(|e| match e {
                Event::McpNetworkConnection(c) => (
                    c.action,
                    c.count,
                    c.since.map(|s| s.timestamp()),
                    c.timestamp.timestamp(),
                ),
                other => panic!("{other:?}"),
            })
            .collect();
        counts.sort_by_key(|c| c.1);
        assert_eq!(
            counts,
            vec![
                (Action::Allow, 1, Some(1_800_000_005), 1_800_000_005),
                (Action::Block, 1000, Some(1_800_000_000), 1_800_000_999)
            ]
        );
    }

    #[test]
    fn past_the_keys_connections_are_counted_in_all_and_said() {
        let mut backlog = Backlog::default();
        for port in 0..MAX_KEYS + 10 {
            backlog.add(connection(&format!("127.0.0.1:{port}"), Action::Block, 0));
        }
        let events = backlog.take();
        assert_eq!(events.len(), MAX_KEYS + 1);
        assert!(events.iter().any(|e| matches!(e, Event::KernelAlert(a) if a.alert == "events_lost" && a.detail.starts_with("10 "))));
    }
}
