//! Taking over the sessions another build of toolwall left pinned (an upgrade, or a downgrade):
//! this build's programs are attached to each session's cgroup first, so that while both are
//! attached both decide and a connect passes only if both let it; then the other build's links
//! are unpinned (the kernel detaches each as its last reference goes), and its event ring is
//! read until empty with the sessions known, so no refusal it recorded before the hand-over is
//! lost. Links this build has no program for (a daemon-run server's egress guards) are moved
//! beside the session's own links and go when the session closes.
//!
//! A build whose daemon still runs (it holds its directory's lock) is left alone and reported.
//! The other build's events are read as this build lays events out; one of another size is
//! counted and reported, not guessed at. Shown by `tests/tests/session_upgrade.rs`, which
//! upgrades a daemon under a live `toolwall exec` to a build of another eBPF object.

use std::path::Path;

use aya::maps::{Map, MapData, RingBuf};

use super::{NetmonService, SessionError};
use crate::{
    cgroup::SessionCgroup,
    decision::Action,
    netmon::{events, pins::OtherBuild},
};

impl NetmonService {
    /// Takes over every session of every other build whose daemon is gone; returns the
    /// sessions taken over, to be treated as adopted.
    pub(super) fn take_over_other_builds(&self, root: &Path) -> Vec<(String, SessionCgroup)> {
        let builds = self
            .monitor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pins()
            .other_builds();
        let mut taken = Vec::new();
        for build in builds {
            if !build.is_free() {
                let detail = format!(
                    "sessions {:?} are pinned at {} by another build of toolwall whose daemon still runs; stop that daemon, and this one takes them over at its next start",
                    build.sessions(),
                    build.dir().display()
                );
                tracing::error!("{detail}");
                self.alert("", "foreign_pins", detail, None, Action::Allow);
                continue;
            }
            let ring = MapData::from_pin(build.ring())
                .map_err(|e| e.to_string())
                .and_then(|data| RingBuf::try_from(Map::RingBuf(data)).map_err(|e| e.to_string()));
            for name in build.sessions() {
                match self.take_over(&build, &name, root) {
                    Ok(Some(cgroup)) => taken.push((name, cgroup)),
                    Ok(None) => {}
                    Err(error) => {
                        let detail = format!(
                            "session {name:?} pinned at {} by another build of toolwall could not be taken over ({error}); its programs still enforce that build's last rules and its events are not read; end the session's processes and remove the pins",
                            build.dir().display()
                        );
                        tracing::error!("{detail}");
                        self.alert(&name, "foreign_pins", detail, None, Action::Allow);
                    }
                }
            }
            // Every link of the build that wrote to the ring is detached by now; a program that
            // was running on another CPU at that moment may still finish its event, hence the
            // second read after a pause.
            match ring {
                Ok(mut ring) => {
                    self.read_other_ring(&mut ring, &build);
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    self.read_other_ring(&mut ring, &build);
                }
                Err(error) => {
                    let detail = format!(
                        "the event ring of another build at {} could not be opened ({error}); what its programs recorded before the hand-over is lost",
                        build.ring().display()
                    );
                    tracing::error!("{detail}");
                    self.alert("", "events_lost", detail, None, Action::Allow);
                }
            }
            if let Err(error) = build.remove_if_empty() {
                tracing::warn!(%error, "could not remove another build's pins");
            }
        }
        taken
    }

    /// One session of `build`: `None` when its cgroup is gone (its pins are removed). A live
    /// cgroup is taken over whether its old links are still attached or were detached; a link
    /// attached to another cgroup, or one that cannot be read, leaves the session alone.
    fn take_over(
        &self,
        build: &OtherBuild,
        name: &str,
        root: &Path,
    ) -> Result<Option<SessionCgroup>, SessionError> {
        crate::cgroup::validate_session_name(name)?;
        let cgroup = SessionCgroup::at(&root.join("toolwall").join(name));
        if !cgroup.path().exists() {
            tracing::info!(session = %name, build = %build.dir().display(), "another build's session whose cgroup is gone: its pins are removed");
            build.unpin_session(name)?;
            return Ok(None);
        }
        let id = cgroup.id()?;
        for pin in build.links(name) {
            match crate::netmon::pins::link_cgroup(&pin) {
                Ok(linked) if linked == id || linked == 0 => {}
                Ok(linked) => {
                    return Err(SessionError::Foreign(format!(
                        "{} is attached to cgroup {linked}, not to the session's ({id})",
                        pin.display()
                    )));
                }
                Err(error) => {
                    return Err(SessionError::Foreign(format!(
                        "{} cannot be read: {error}",
                        pin.display()
                    )));
                }
            }
        }
        let links = self.register(name, &cgroup)?;
        // From here the session is this daemon's: what is left of the other build is reported,
        // and the session is watched and closed like any other.
        let (programs, own_dir) = {
            let monitor = self.monitor.lock().unwrap_or_else(|e| e.into_inner());
            (monitor.session_programs(), monitor.pins().session(name))
        };
        let mut moved = 0;
        let mut leftovers = Vec::new();
        for pin in build.links(name) {
            let Some(file) = pin.file_name() else {
                continue;
            };
            if programs.iter().any(|p| std::ffi::OsStr::new(p) == file) {
                continue;
            }
            // A guard this build has no program for stays attached, beside the session's own
            // links, under a name this build never pins.
            let mut kept = std::ffi::OsString::from("previous-build-");
            kept.push(file);
            match std::fs::rename(&pin, own_dir.join(&kept)) {
                Ok(()) => moved += 1,
                Err(error) => leftovers.push(format!("{}: {error}", pin.display())),
            }
        }
        if let Err(error) = build.unpin_session(name) {
            leftovers.push(error.to_string());
        }
        let processes = cgroup.processes().map(|p| p.len()).unwrap_or(0);
        let detail = format!(
            "took over session {name:?} from another build of toolwall ({}): this build's {} programs attached ({links} already were) before that build's were detached, {moved} of its guards kept; {processes} processes in it{}",
            build.dir().display(),
            programs.len(),
            if leftovers.is_empty() {
                String::new()
            } else {
                format!("; left of the other build: {}", leftovers.join("; "))
            }
        );
        tracing::warn!("{detail}");
        self.alert(name, "session_taken_over", detail, None, Action::Allow);
        Ok(Some(cgroup))
    }

    /// Records what the other build's ring holds. Its rules' indices are not this build's, so
    /// a connect one of its rules decided is recorded as `toolwall:previous-build`; the session
    /// boundary's verdicts keep their names.
    fn read_other_ring(&self, ring: &mut RingBuf<MapData>, build: &OtherBuild) {
        let (mut read, mut unread) = (0u64, 0u64);
        while let Some(item) = ring.next() {
            match events::decode_exact(&item) {
                Some(connect) => {
                    let mut event = self.to_event(&connect);
                    let index = connect.raw.server_index;
                    if !agent_common::rule::is_boundary(index)
                        && index != agent_common::rule::EGRESS_INDEX
                    {
                        event.server_id = "toolwall:previous-build".to_owned();
                        event.server_type = "previous-build".to_owned();
                    }
                    self.record(event);
                    read += 1;
                }
                None => unread += 1,
            }
        }
        tracing::info!(read, unread, build = %build.dir().display(), "read another build's event ring");
        if unread > 0 {
            let detail = format!(
                "{unread} events in the ring of another build at {} are laid out unlike this build's and were not recorded ({read} were)",
                build.dir().display()
            );
            tracing::error!("{detail}");
            self.alert("", "events_lost", detail, None, Action::Allow);
        }
    }
}
