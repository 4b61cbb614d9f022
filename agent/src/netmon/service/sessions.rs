//! Sessions: opening, closing and re-adopting their cgroups, attributing kernel events to
//! them, limiting daemon-run servers' egress, and watching each for a detached program or a
//! process that left.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    sync::atomic::Ordering,
};

use super::{NetmonService, SessionError};
use crate::{cgroup::SessionCgroup, decision::Action, netmon::NetmonError};

/// Session ids the reader attributes events to: open sessions, and closed ones until every
/// event they can have left in the ring was read (otherwise events read after their session
/// closed would lose it).
#[derive(Debug, Default)]
pub(super) struct Attribution {
    open: HashMap<u64, String>,
    /// (cgroup id, session, drains completed when it closed).
    closed: Vec<(u64, String, u64)>,
}

impl Attribution {
    /// Most closed sessions remembered while no drain runs (none does while the ring is idle).
    const MAX_CLOSED: usize = 4096;

    pub(super) fn name(&self, id: u64) -> Option<&str> {
        self.open.get(&id).map(String::as_str).or_else(|| {
            self.closed
                .iter()
                .rev()
                .find(|(i, _, _)| *i == id)
                .map(|(_, n, _)| n.as_str())
        })
    }

    fn close(&mut self, id: u64, drains: u64) {
        if let Some(name) = self.open.remove(&id) {
            if self.closed.len() == Self::MAX_CLOSED {
                self.closed.remove(0);
            }
            self.closed.push((id, name, drains));
        }
    }

    /// Forgets closed sessions once a whole drain ran after they closed: the drain under way at
    /// the close may have passed their last events' place already, the one after cannot.
    pub(super) fn retire(&mut self, drains: u64) {
        self.closed.retain(|(_, _, at)| drains < at + 2);
    }
}

impl NetmonService {
    /// Creates (or reuses) the session's cgroup and attaches the programs to it.
    pub(crate) fn open_session(&self, name: &str) -> Result<SessionCgroup, SessionError> {
        let cgroup = SessionCgroup::create(name)?;
        if let Err(error) = self.register(name, &cgroup) {
            // Not watched, so not left behind: an empty cgroup nobody would close.
            if let Err(cleanup) = cgroup.remove_if_empty() {
                tracing::warn!(session = %name, %cleanup, "removing the cgroup of a session that failed to open");
            }
            return Err(error);
        }
        Ok(cgroup)
    }

    pub(super) fn register(
        &self,
        name: &str,
        cgroup: &SessionCgroup,
    ) -> Result<usize, SessionError> {
        let id = cgroup.id()?;
        let adopted = self
            .monitor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .attach(name, cgroup.path())?;
        self.sessions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .open
            .insert(id, name.to_owned());
        Ok(adopted)
    }

    /// The sessions adopted at start (once).
    pub(crate) fn take_adopted(&self) -> Vec<(String, SessionCgroup)> {
        std::mem::take(&mut *self.adopted.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Takes over the sessions a daemon before this one left pinned (it died, or stopped while
    /// they still had processes): their programs never stopped enforcing; from now on their
    /// events are read and their programs watched again. A pinned session whose cgroup is gone
    /// is unpinned. Sessions pinned by another build are taken over (`takeover.rs`).
    pub(super) fn adopt_pinned(&self) -> Result<Vec<(String, SessionCgroup)>, SessionError> {
        let names = self
            .monitor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pins()
            .sessions()?;
        let root = crate::cgroup::cgroup2_mount()?;
        let mut adopted = Vec::new();
        // One session that cannot be adopted does not keep the others, or another build's, from
        // being taken over.
        for name in names {
            match self.adopt_one(&root, &name) {
                Ok(Some(cgroup)) => adopted.push((name, cgroup)),
                Ok(None) => {}
                Err(error) => {
                    let detail = format!(
                        "session {name:?} left pinned by an earlier daemon could not be re-adopted ({error}); its programs stay attached and enforcing the rules they last had, but its events are not read"
                    );
                    tracing::error!("{detail}");
                    self.alert(&name, "adoption_failed", detail, None, Action::Allow);
                }
            }
        }
        adopted.extend(self.take_over_other_builds(&root));
        Ok(adopted)
    }

    /// Re-adopts one session this build pinned; `None` when its cgroup is gone (its pins are
    /// removed).
    fn adopt_one(
        &self,
        root: &std::path::Path,
        name: &str,
    ) -> Result<Option<SessionCgroup>, SessionError> {
        crate::cgroup::validate_session_name(name)?;
        let cgroup = SessionCgroup::at(&root.join("toolwall").join(name));
        if !cgroup.path().exists() {
            tracing::info!(session = %name, "a pinned session whose cgroup is gone: its pins are removed");
            self.monitor
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pins()
                .remove_session(name)?;
            return Ok(None);
        }
        let links = self.register(name, &cgroup)?;
        let processes = cgroup.processes().map(|p| p.len()).unwrap_or(0);
        let programs = self
            .monitor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .session_programs()
            .len();
        let detail = format!(
            "re-adopted session {name:?} left pinned by an earlier daemon: {links} of {programs} programs were still attached, {processes} processes in it"
        );
        tracing::warn!("{detail}");
        self.alert(name, "session_adopted", detail, None, Action::Allow);
        Ok(Some(cgroup))
    }

    /// Limits a session's cgroup (a daemon-run stdio server's) to the destinations its
    /// declaration allows (`egress:`); refused connections are recorded as the server's.
    pub(crate) fn limit_egress(
        &self,
        name: &str,
        cgroup: &SessionCgroup,
        server_id: &str,
        allowed: &[crate::config::EgressRule],
    ) -> Result<(), SessionError> {
        let id = cgroup.id()?;
        let allowed: Vec<(std::net::Ipv6Addr, u32, u16)> = allowed
            .iter()
            .map(|rule| match rule.addr {
                IpAddr::V4(v4) => (v4.to_ipv6_mapped(), 96 + u32::from(rule.prefix), rule.port),
                IpAddr::V6(v6) => (v6, u32::from(rule.prefix), rule.port),
            })
            .collect();
        self.egress_owners
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, server_id.to_owned());
        self.monitor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .limit_egress(name, id, &allowed)?;
        Ok(())
    }

    /// Detaches from the session's cgroup, unpins it and removes the cgroup if it is empty.
    pub(crate) fn close_session(
        &self,
        name: &str,
        cgroup: &SessionCgroup,
    ) -> Result<bool, SessionError> {
        let id = cgroup.id()?;
        {
            let mut monitor = self.monitor.lock().unwrap_or_else(|e| e.into_inner());
            monitor.detach(name)?;
            monitor.forget_egress(id)?;
        }
        self.egress_owners
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
        let drains = self.drains.load(Ordering::Acquire);
        self.sessions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .close(id, drains);
        self.members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
        // A process killed a moment ago may still count against its cgroup after it left
        // `cgroup.procs` (rmdir: EBUSY): a short while is given before the directory is left
        // behind (empty `…-mcp-…` cgroups stayed after every daemon-run server).
        for _ in 0..10 {
            if cgroup.remove_if_empty()? {
                return Ok(true);
            }
            if !cgroup.all_processes()?.is_empty() {
                return Ok(false);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        Ok(false)
    }

    /// Removes the maps' pins when no session is left pinned (a clean stop).
    pub(crate) fn unpin_if_unused(&self) -> Result<bool, NetmonError> {
        Ok(self
            .monitor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pins()
            .remove_if_unused()?)
    }

    /// One round of the watch: a program detached from a session is attached again, a process
    /// that left its session is moved back; each is recorded as a `kernel_alert`.
    pub(super) fn watch(&self) {
        let sessions: Vec<(String, std::path::PathBuf)> = {
            let monitor = self.monitor.lock().unwrap_or_else(|e| e.into_inner());
            let names: Vec<String> = self
                .sessions
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .open
                .values()
                .cloned()
                .collect();
            names
                .into_iter()
                .filter_map(|n| {
                    let path = monitor.cgroup_of(&n)?.to_path_buf();
                    Some((n, path))
                })
                .collect()
        };
        for (name, path) in sessions {
            let detached = self
                .monitor
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .detached(&name);
            if !detached.is_empty() {
                let result = self
                    .monitor
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .attach(&name, &path);
                let detail = match result {
                    Ok(_) => format!(
                        "{} detached from session {name:?}; attached again",
                        detached.join(", ")
                    ),
                    Err(error) => format!(
                        "{} detached from session {name:?}; attaching again failed: {error}",
                        detached.join(", ")
                    ),
                };
                tracing::error!("{detail}");
                self.alert(&name, "program_detached", detail, None, Action::Block);
            }
            self.watch_members(&name, &SessionCgroup::at(&path));
        }
    }

    fn watch_members(&self, name: &str, cgroup: &SessionCgroup) {
        let Ok(now) = cgroup.all_processes() else {
            return;
        };
        let now: HashSet<u32> = now.into_iter().collect();
        let before = self
            .members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_owned(), now.clone())
            .unwrap_or_default();
        for pid in before.difference(&now) {
            // Gone from the session: exited (fine), or alive elsewhere (it left).
            let Some(elsewhere) = crate::cgroup::cgroup_path_of(&pid.to_string()) else {
                continue;
            };
            // A zombie still names its last cgroup.
            if crate::cgroup::session_in(&format!("0::{elsewhere}")).as_deref() == Some(name) {
                continue;
            }
            let moved_back = cgroup.add_process(*pid);
            let detail = match &moved_back {
                Ok(()) => format!(
                    "process {pid} left session {name:?} for cgroup {elsewhere}; moved back"
                ),
                Err(error) => format!(
                    "process {pid} left session {name:?} for cgroup {elsewhere}; moving it back failed: {error}"
                ),
            };
            tracing::error!("{detail}");
            self.members
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(name.to_owned())
                .or_default()
                .insert(*pid);
            let action = if moved_back.is_ok() {
                Action::Block
            } else {
                Action::Allow
            };
            self.alert(name, "process_left", detail, Some(*pid), action);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_sessions_keep_their_events_until_a_whole_drain_ran() {
        let mut attribution = Attribution::default();
        attribution.open.insert(7, "s".into());
        attribution.close(7, 10);
        assert_eq!(
            attribution.name(7),
            Some("s"),
            "closed, events may be in the ring"
        );
        attribution.retire(11);
        assert_eq!(
            attribution.name(7),
            Some("s"),
            "the drain under way at the close"
        );
        attribution.retire(12);
        assert_eq!(attribution.name(7), None, "a whole drain ran since");
    }
}
