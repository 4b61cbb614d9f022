//! Loading the embedded object, attaching it to cgroups, and reading its counters.

use std::{
    fs::File,
    path::{Path, PathBuf},
};

use agent_common::{
    connect::EVENTS_MAP,
    counters,
    rule::{CIDR_MAP, CidrKey, ENDPOINTS_MAP, EndpointKey, EndpointRule},
};
use aya::{
    Ebpf, EbpfLoader,
    maps::{
        HashMap, MapData, PerCpuArray, RingBuf,
        lpm_trie::{Key, LpmTrie},
    },
    programs::{CgroupAttachMode, CgroupSockAddr, cgroup_sock_addr::CgroupSockAddrLink},
};
use thiserror::Error;

use super::rules::{MapContents, Rule};

/// The kernel programs, as built by `agent/build.rs` (empty when built without the toolchain).
pub fn ebpf_object() -> &'static [u8] {
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
    /// The cgroup directory could not be opened.
    #[error("open cgroup {path}: {source}")]
    Cgroup {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The two programs and what they attach as.
const PROGRAMS: [&str; 2] = ["connect4", "connect6"];

/// Sums of the per-CPU counters (see `agent_common::counters`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Every connect seen.
    pub connects: u64,
    /// Connects that matched no rule.
    pub unmatched: u64,
    /// Connects that matched a FLAG rule.
    pub flagged: u64,
    /// Connects refused by a DENY rule.
    pub denied: u64,
    /// Events lost because the ring buffer was full.
    pub ring_drops: u64,
}

/// One program's run count and total run time since it was loaded (see
/// [`KernelMonitor::run_stats`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProgramRunStats {
    /// `connect4` or `connect6`.
    pub program: &'static str,
    /// Times it ran while statistics were on.
    pub runs: u64,
    /// Kernel time spent in it while statistics were on.
    pub run_time: std::time::Duration,
}

/// The loaded programs and the links that keep them attached.
///
/// Links are bpf_links owned by this process: they detach when it is dropped or the process
/// dies, crash included, so no program is ever left behind on a cgroup.
pub struct KernelMonitor {
    ebpf: Ebpf,
    links: Vec<(PathBuf, CgroupSockAddrLink)>,
}

impl KernelMonitor {
    /// Loads and verifies both programs; `kernel_log` enables aya-log debug output from them.
    pub fn load(kernel_log: bool) -> Result<Self, NetmonError> {
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
        let mut ebpf = EbpfLoader::new()
            .override_global(aya_log::LEVEL, &level, true)
            .load(object)?;
        for name in PROGRAMS {
            let program: &mut CgroupSockAddr = ebpf
                .program_mut(name)
                .ok_or(NetmonError::Missing("connect program"))?
                .try_into()
                .map_err(|source| NetmonError::Program {
                    what: format!("{name}: wrong type"),
                    source,
                })?;
            program.load().map_err(|source| NetmonError::Program {
                what: format!("verify {name}"),
                source,
            })?;
        }
        Ok(Self {
            ebpf,
            links: Vec::new(),
        })
    }

    /// Attaches both programs to a cgroup v2 directory through bpf_links (which coexist with any
    /// other programs there; link_create takes no ALLOW_MULTI flag, hence `Single`).
    pub fn attach(&mut self, cgroup: &Path) -> Result<(), NetmonError> {
        let dir = File::open(cgroup).map_err(|source| NetmonError::Cgroup {
            path: cgroup.to_path_buf(),
            source,
        })?;
        for name in PROGRAMS {
            let program: &mut CgroupSockAddr = self
                .ebpf
                .program_mut(name)
                .ok_or(NetmonError::Missing("connect program"))?
                .try_into()
                .map_err(|source| NetmonError::Program {
                    what: format!("{name}: wrong type"),
                    source,
                })?;
            let what = || format!("attach {name} to {}", cgroup.display());
            let id = program
                .attach(&dir, CgroupAttachMode::Single)
                .map_err(|source| NetmonError::Program {
                    what: what(),
                    source,
                })?;
            let link = program
                .take_link(id)
                .map_err(|source| NetmonError::Program {
                    what: what(),
                    source,
                })?;
            self.links.push((cgroup.to_path_buf(), link));
        }
        Ok(())
    }

    /// Detaches both programs from a cgroup (no-op if they were not attached there).
    pub fn detach(&mut self, cgroup: &Path) {
        self.links.retain(|(path, _)| path != cgroup);
    }

    /// The cgroups the programs are attached to.
    pub fn attached(&self) -> impl Iterator<Item = &Path> {
        self.links
            .iter()
            .map(|(p, _)| p.as_path())
            .step_by(PROGRAMS.len())
    }

    /// Makes the rule maps hold exactly `rules` (after loopback widening): new entries are
    /// written before stale ones are removed, so a rule being changed is never briefly absent.
    /// Takes effect on the next connect; nothing is re-attached.
    pub fn sync_rules(&mut self, rules: &[Rule]) -> Result<(), NetmonError> {
        let want = MapContents::from_rules(rules);
        let map_err = |name| move |source| NetmonError::Map { name, source };

        let map = self
            .ebpf
            .map_mut(ENDPOINTS_MAP)
            .ok_or(NetmonError::Missing("ENDPOINTS map"))?;
        let mut exact = HashMap::<_, EndpointKey, EndpointRule>::try_from(map)
            .map_err(map_err(ENDPOINTS_MAP))?;
        for (key, value) in &want.exact {
            exact
                .insert(key, value, 0)
                .map_err(map_err(ENDPOINTS_MAP))?;
        }
        let stale: Vec<EndpointKey> = exact
            .keys()
            .filter_map(Result::ok)
            .filter(|k| !want.exact.contains_key(k))
            .collect();
        for key in stale {
            exact.remove(&key).map_err(map_err(ENDPOINTS_MAP))?;
        }

        let map = self
            .ebpf
            .map_mut(CIDR_MAP)
            .ok_or(NetmonError::Missing("CIDR_RULES map"))?;
        let mut cidr =
            LpmTrie::<_, CidrKey, EndpointRule>::try_from(map).map_err(map_err(CIDR_MAP))?;
        for ((bits, key), value) in &want.cidr {
            cidr.insert(&Key::new(*bits, *key), value, 0)
                .map_err(map_err(CIDR_MAP))?;
        }
        let stale: Vec<Key<CidrKey>> = cidr
            .keys()
            .filter_map(Result::ok)
            .filter(|k| !want.cidr.contains_key(&(k.prefix_len(), k.data())))
            .collect();
        for key in stale {
            cidr.remove(&key).map_err(map_err(CIDR_MAP))?;
        }
        Ok(())
    }

    /// Hands out the event ring buffer (once) for [`super::events::spawn_reader`].
    pub fn take_event_ring(&mut self) -> Result<RingBuf<MapData>, NetmonError> {
        let map = self
            .ebpf
            .take_map(EVENTS_MAP)
            .ok_or(NetmonError::Missing("EVENTS ring buffer"))?;
        RingBuf::try_from(map).map_err(|source| NetmonError::Map {
            name: EVENTS_MAP,
            source,
        })
    }

    /// How often each program ran and the time the kernel spent in it (`connect4`, then
    /// `connect6`), as the kernel counts them while run-time statistics are on (hold
    /// `aya::sys::enable_stats(Stats::RunTime)`; without it both stay zero). The cost of the
    /// kernel layer per connect, free of the noise a user-space clock adds.
    pub fn run_stats(&self) -> Result<Vec<ProgramRunStats>, NetmonError> {
        PROGRAMS
            .iter()
            .map(|&name| {
                let program: &CgroupSockAddr = self
                    .ebpf
                    .program(name)
                    .ok_or(NetmonError::Missing("connect program"))?
                    .try_into()
                    .map_err(|source| NetmonError::Program {
                        what: format!("{name}: wrong type"),
                        source,
                    })?;
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
            .collect()
    }

    /// Reads and sums the per-CPU counters.
    pub fn counters(&self) -> Result<Counters, NetmonError> {
        let map = self
            .ebpf
            .map(counters::MAP_NAME)
            .ok_or(NetmonError::Missing("COUNTERS map"))?;
        let array = PerCpuArray::<_, u64>::try_from(map).map_err(|source| NetmonError::Map {
            name: counters::MAP_NAME,
            source,
        })?;
        let sum = |index: u32| -> Result<u64, NetmonError> {
            let values = array.get(&index, 0).map_err(|source| NetmonError::Map {
                name: counters::MAP_NAME,
                source,
            })?;
            Ok(values.iter().sum())
        };
        Ok(Counters {
            connects: sum(counters::CONNECTS)?,
            unmatched: sum(counters::UNMATCHED)?,
            flagged: sum(counters::FLAGGED)?,
            denied: sum(counters::DENIED)?,
            ring_drops: sum(counters::RING_DROPS)?,
        })
    }
}
