//! Loading the embedded object, attaching it to cgroups, and reading its counters.

mod maps;
mod ports;
mod unix;

use std::{
    fs::File,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    programs::{
        CgroupAttachMode, CgroupSkb, CgroupSkbAttachType, CgroupSock, CgroupSockAddr,
        links::{FdLink, PinnedLink},
    },
};
use thiserror::Error;

use super::pins::{PinDir, PinError};

pub(crate) use maps::Counters;

/// The kernel programs, as built by `agent/build.rs` (empty when built without the toolchain).
pub(crate) fn ebpf_object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/toolwall.bpf.o"))
}

/// Why the kernel layer could not start; each variant says what to do about it.
#[derive(Debug, Error)]
pub enum NetmonError {
    /// The binary was built without the eBPF toolchain.
    #[error(
        "this toolwall was built without its eBPF programs ({0}); run `cargo xtask setup` and rebuild"
    )]
    NotBuilt(&'static str),
    /// Loading needs CAP_BPF/CAP_SYS_ADMIN.
    #[error("loading eBPF programs needs root (CAP_BPF and CAP_NET_ADMIN); run the daemon as root")]
    NotRoot,
    /// The kernel refused the object (verifier, missing BPF support).
    #[error("the kernel refused toolwall's eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
    /// A program could not be loaded or attached.
    #[error("{what}: {source}")]
    Program {
        /// Which program and what step.
        what: String,
        /// aya's error.
        source: aya::programs::ProgramError,
    },
    /// A map was missing or could not be read or written.
    #[error("eBPF map {name}: {source}")]
    Map {
        /// The map's name.
        name: &'static str,
        /// aya's error.
        source: aya::maps::MapError,
    },
    /// The object lacks a map or program the daemon expects (stale build).
    #[error("the eBPF object has no {0}; rebuild toolwall")]
    Missing(&'static str),
    /// The pin directory on bpffs could not be used.
    #[error(transparent)]
    Pins(#[from] PinError),
    /// A link could not be pinned, re-opened or unpinned.
    #[error("{what} {path}: {source}")]
    Pin {
        /// What was being done.
        what: &'static str,
        /// The pin.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A `bpf()` call on a program toolwall loads itself (the Unix socket ones) failed.
    #[error("{what}: {source}")]
    Bpf {
        /// Which program and what step.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The cgroup directory could not be opened.
    #[error("open cgroup {path}: {source}")]
    Cgroup {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The programs on every session's cgroup; each attaches as the hook its name says.
pub(crate) const PROGRAMS: [&str; 7] = [
    "connect4",
    "connect6",
    "sendmsg4",
    "sendmsg6",
    "post_bind4",
    "post_bind6",
    "sock_create",
];

/// Which of [`PROGRAMS`] are `cgroup_sock` programs (the bind and socket creation hooks); the
/// others are `cgroup_sock_addr` ones.
fn is_sock_program(name: &str) -> bool {
    matches!(name, "post_bind4" | "post_bind6" | "sock_create")
}

/// The `cgroup_skb` programs attached to egress-limited cgroups only (daemon-run stdio
/// servers' with an `egress:` list), with the direction each filters.
const GUARDS: [(&str, CgroupSkbAttachType); 2] = [
    ("egress_guard", CgroupSkbAttachType::Egress),
    ("ingress_guard", CgroupSkbAttachType::Ingress),
];

/// One program's run count and total run time since it was loaded (see
/// [`KernelMonitor::run_stats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramRunStats {
    /// One of [`PROGRAMS`] or a Unix socket program.
    pub program: &'static str,
    /// Times it ran while statistics were on.
    pub runs: u64,
    /// Kernel time spent in it while statistics were on.
    pub run_time: std::time::Duration,
}

/// One session's attachment: its cgroup and the pinned links holding the programs on it.
struct Attached {
    cgroup: PathBuf,
    /// Each program's link and where it is pinned, in the order of [`PROGRAMS`].
    links: Vec<(PathBuf, PinnedLink)>,
}

/// The loaded programs and the links that keep them attached.
///
/// Links are pinned on bpffs (see [`super::pins`]): they stay attached when this process dies,
/// crash included, and are detached only by [`KernelMonitor::detach`], when a session ends.
pub struct KernelMonitor {
    ebpf: Ebpf,
    pins: PinDir,
    sessions: std::collections::HashMap<String, Attached>,
    /// The Unix socket programs, or why the kernel cannot run them (sessions then have no
    /// Unix socket confinement).
    unix: Result<unix::UnixPrograms, String>,
}

impl KernelMonitor {
    /// Loads and verifies the programs onto the maps pinned in `pin_root` (created if missing,
    /// re-opened if a daemon before this one pinned them); `kernel_log` enables aya-log debug
    /// output from them.
    pub fn load(kernel_log: bool, pin_root: &Path) -> Result<Self, NetmonError> {
        let object = ebpf_object();
        if object.is_empty() {
            return Err(NetmonError::NotBuilt(
                option_env!("TOOLWALL_EBPF_MISSING").unwrap_or("no eBPF object embedded"),
            ));
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(NetmonError::NotRoot);
        }
        // Off unless asked for: the kernel side checks this level before formatting anything.
        let level: u8 = if kernel_log {
            aya_log::Level::Debug as u8
        } else {
            0
        };
        let pins = PinDir::open(pin_root, object)?;
        let mut ebpf = EbpfLoader::new()
            .override_global(aya_log::LEVEL, &level, true)
            .default_map_pin_directory(pins.maps())
            .load(object)?;
        for name in PROGRAMS {
            let verify = |source| NetmonError::Program {
                what: format!("verify {name}"),
                source,
            };
            if is_sock_program(name) {
                let program: &mut CgroupSock = program(&mut ebpf, name)?;
                program.load().map_err(verify)?;
            } else {
                let program: &mut CgroupSockAddr = program(&mut ebpf, name)?;
                program.load().map_err(verify)?;
            }
        }
        for (name, _) in GUARDS {
            let program: &mut CgroupSkb = program(&mut ebpf, name)?;
            program.load().map_err(|source| NetmonError::Program {
                what: format!("verify {name}"),
                source,
            })?;
        }
        let unix = unix::UnixPrograms::load(object, &pins.maps());
        if let Err(why) = &unix {
            tracing::warn!("sessions get no Unix socket confinement: {why}");
        }
        let mut monitor = Self {
            ebpf,
            pins,
            sessions: std::collections::HashMap::new(),
            unix,
        };
        if monitor.unix.is_ok() {
            monitor.list_always_listed()?;
        }
        Ok(monitor)
    }

    /// Why sessions get no Unix socket confinement (a kernel before 6.7 has no Unix socket
    /// hooks); `None` when they have it.
    pub fn unix_missing(&self) -> Option<&str> {
        self.unix.as_ref().err().map(String::as_str)
    }

    /// The programs every session gets, in the order of its links: [`PROGRAMS`], then the
    /// Unix socket programs when the kernel runs them.
    pub(crate) fn session_programs(&self) -> Vec<&'static str> {
        let unix = self.unix.iter().flat_map(|u| u.names());
        PROGRAMS.iter().copied().chain(unix).collect()
    }

    /// The pin directory (to list sessions a daemon before this one left behind).
    pub fn pins(&self) -> &PinDir {
        &self.pins
    }

    /// Attaches every program to a session's cgroup v2 directory through bpf_links (which
    /// coexist with any other programs there; link_create takes no ALLOW_MULTI flag, hence
    /// `Single`) and pins each link. A link already pinned for the session (a daemon before
    /// this one attached it) is adopted instead; one that is missing is attached anew.
    /// Returns how many links were adopted.
    pub fn attach(&mut self, session: &str, cgroup: &Path) -> Result<usize, NetmonError> {
        let dir = File::open(cgroup).map_err(|source| NetmonError::Cgroup {
            path: cgroup.to_path_buf(),
            source,
        })?;
        let pin_dir = self.pins.session(session);
        std::fs::create_dir_all(&pin_dir).map_err(|source| NetmonError::Pin {
            what: "create",
            path: pin_dir.clone(),
            source,
        })?;
        let programs = self.session_programs();
        let mut links = Vec::with_capacity(programs.len());
        let mut adopted = 0;
        for name in programs {
            let pin = pin_dir.join(name);
            if pin.exists() {
                match PinnedLink::from_pin(&pin) {
                    Ok(link) if super::pins::link_cgroup(&pin).ok() == cgroup_id(cgroup) => {
                        links.push((pin, link));
                        adopted += 1;
                        continue;
                    }
                    // Detached behind our back, or unreadable: replace it.
                    _ => std::fs::remove_file(&pin).map_err(|source| NetmonError::Pin {
                        what: "unpin",
                        path: pin.clone(),
                        source,
                    })?,
                }
            }
            let attach_error = |source| NetmonError::Program {
                what: format!("attach {name} to {}", cgroup.display()),
                source,
            };
            let pinned = if let Ok(unix) = self.unix.as_ref()
                && let Some(attach) = unix.attach(name, &dir, &pin)
            {
                attach.map_err(|source| NetmonError::Pin {
                    what: "attach and pin",
                    path: pin.clone(),
                    source,
                })?
            } else if is_sock_program(name) {
                let program: &mut CgroupSock = program(&mut self.ebpf, name)?;
                let link = program
                    .attach(&dir, CgroupAttachMode::Single)
                    .and_then(|id| program.take_link(id))
                    .map_err(attach_error)?;
                pin_link(link, &pin)?
            } else {
                let program: &mut CgroupSockAddr = program(&mut self.ebpf, name)?;
                let link = program
                    .attach(&dir, CgroupAttachMode::Single)
                    .and_then(|id| program.take_link(id))
                    .map_err(attach_error)?;
                pin_link(link, &pin)?
            };
            links.push((pin.clone(), pinned));
        }
        self.sessions.insert(
            session.to_owned(),
            Attached {
                cgroup: cgroup.to_path_buf(),
                links,
            },
        );
        Ok(adopted)
    }

    /// Detaches the programs from a session's cgroup and removes its pins (no-op for a session
    /// that is not attached).
    pub fn detach(&mut self, session: &str) -> Result<(), NetmonError> {
        let Some(attached) = self.sessions.remove(session) else {
            return Ok(());
        };
        for (path, link) in attached.links {
            // Unpinned and dropped: the last reference goes and the kernel detaches.
            link.unpin().map_err(|source| NetmonError::Pin {
                what: "unpin",
                path,
                source,
            })?;
        }
        let dir = self.pins.session(session);
        // Links a daemon before this one pinned and this one did not adopt (an egress guard).
        if let Ok(entries) = std::fs::read_dir(&dir) {
            for entry in entries.flatten() {
                std::fs::remove_file(entry.path()).map_err(|source| NetmonError::Pin {
                    what: "unpin",
                    path: entry.path(),
                    source,
                })?;
            }
        }
        std::fs::remove_dir(&dir).map_err(|source| NetmonError::Pin {
            what: "remove",
            path: dir,
            source,
        })
    }

    /// The programs of a session that are no longer attached to its cgroup (someone detached
    /// a link or removed its pin), for the daemon's watch; [`Self::attach`] puts them back.
    pub fn detached(&self, session: &str) -> Vec<&'static str> {
        let programs = self.session_programs();
        let Some(attached) = self.sessions.get(session) else {
            return programs;
        };
        // What cannot be read (out of descriptors, say) is not reported as detached: a false
        // alert each second is what exhausting the daemon's descriptors would get otherwise.
        let Some(want) = cgroup_id(&attached.cgroup) else {
            return Vec::new();
        };
        programs
            .into_iter()
            .zip(&attached.links)
            .filter(|(_, (pin, _))| match super::pins::link_cgroup(pin) {
                Ok(id) => id != want,
                Err(e) => e.kind() == std::io::ErrorKind::NotFound,
            })
            .map(|(name, _)| name)
            .collect()
    }

    /// The cgroup of an attached session.
    pub fn cgroup_of(&self, session: &str) -> Option<&Path> {
        self.sessions.get(session).map(|a| a.cgroup.as_path())
    }

    /// The cgroups the programs are attached to.
    pub fn attached(&self) -> impl Iterator<Item = &Path> {
        self.sessions.values().map(|a| a.cgroup.as_path())
    }

    /// Attaches [`GUARDS`] to an attached session's cgroup, pinned beside its other links
    /// (and detached with them).
    fn attach_guards(&mut self, session: &str) -> Result<(), NetmonError> {
        let Some(attached) = self.sessions.get(session) else {
            return Err(NetmonError::Missing("the session to limit"));
        };
        let cgroup = attached.cgroup.clone();
        let dir = File::open(&cgroup).map_err(|source| NetmonError::Cgroup {
            path: cgroup.clone(),
            source,
        })?;
        let pin_dir = self.pins.session(session);
        let mut links = Vec::with_capacity(GUARDS.len());
        for (name, direction) in GUARDS {
            let pin = pin_dir.join(name);
            let program: &mut CgroupSkb = program(&mut self.ebpf, name)?;
            let what = || format!("attach {name} to {}", cgroup.display());
            let link = program
                .attach(&dir, direction, CgroupAttachMode::Single)
                .and_then(|id| program.take_link(id))
                .map_err(|source| NetmonError::Program {
                    what: what(),
                    source,
                })?;
            links.push((pin.clone(), pin_link(link, &pin)?));
        }
        if let Some(attached) = self.sessions.get_mut(session) {
            attached.links.extend(links);
        }
        Ok(())
    }

    /// How often each program ran and the time the kernel spent in it (each of [`PROGRAMS`],
    /// then the Unix socket programs), as the kernel counts them while run-time statistics are
    /// on (hold `aya::sys::enable_stats(Stats::RunTime)`; without it both stay zero). The cost
    /// of the kernel layer per connect, free of the noise a user-space clock adds.
    pub fn run_stats(&self) -> Result<Vec<ProgramRunStats>, NetmonError> {
        let mut stats = PROGRAMS
            .iter()
            .map(|&name| {
                let program = self
                    .ebpf
                    .program(name)
                    .ok_or(NetmonError::Missing("a session program"))?;
                let info = program.info().map_err(|source| NetmonError::Program {
                    what: format!("{name}: read its info"),
                    source,
                })?;
                Ok(ProgramRunStats {
                    program: name,
                    runs: info.run_count(),
                    run_time: info.run_time(),
                })
            })
            .collect::<Result<Vec<_>, NetmonError>>()?;
        if let Ok(unix) = &self.unix {
            stats.extend(unix.run_stats()?);
        }
        Ok(stats)
    }
}

/// A cgroup directory's id (its inode number), as links and events report it.
fn cgroup_id(cgroup: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(cgroup).ok().map(|m| m.ino())
}

fn map_err(name: &'static str) -> impl Fn(aya::maps::MapError) -> NetmonError {
    move |source| NetmonError::Map { name, source }
}

/// One of the loaded programs, as its type.
fn program<'a, P>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut P, NetmonError>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or(NetmonError::Missing("an eBPF program"))?
        .try_into()
        .map_err(|source| NetmonError::Program {
            what: format!("{name}: wrong type"),
            source,
        })
}

/// Pins a freshly attached program's link at `pin`, so it outlives this process.
fn pin_link<L>(link: L, pin: &Path) -> Result<PinnedLink, NetmonError>
where
    FdLink: TryFrom<L>,
    <FdLink as TryFrom<L>>::Error: std::fmt::Display,
{
    let link = FdLink::try_from(link).map_err(|e| NetmonError::Pin {
        what: "take the bpf_link of",
        path: pin.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    })?;
    link.pin(pin).map_err(|e| NetmonError::Pin {
        what: "pin",
        path: pin.to_path_buf(),
        source: std::io::Error::other(e.to_string()),
    })
}
