//! The Unix socket programs: loaded and attached by hand, since aya has no Unix attach types,
//! and the names every session may reach (`UNIX_LISTED`).
//!
//! The object's `unix_connect` and `unix_sendmsg` are `cgroup_sock_addr` programs whose
//! sections aya parses as IPv4 ones; here they are relocated against the maps aya created and
//! pinned (found by their pins), then loaded with `BPF_CGROUP_UNIX_CONNECT` /
//! `BPF_CGROUP_UNIX_SENDMSG` (Linux 6.7) and attached through bpf_links pinned beside the
//! others, so they live and die exactly as the rest of a session's programs.

use std::{
    collections::HashSet,
    ffi::CString,
    fs::File,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
    path::Path,
};

use agent_common::unix::{ALWAYS_LISTED, UNIX_LISTED_MAP, UnixName};
use aya::{
    maps::{HashMap, MapData},
    programs::links::PinnedLink,
};
use aya_obj::generated::{bpf_attach_type, bpf_attr, bpf_cmd, bpf_prog_info, bpf_prog_type};

use super::{KernelMonitor, NetmonError, ProgramRunStats, map_err, ports::make_exactly};

/// Each Unix program and the attach type it is loaded and attached with.
const PROGRAMS: [(&str, bpf_attach_type); 2] = [
    ("unix_connect", bpf_attach_type::BPF_CGROUP_UNIX_CONNECT),
    ("unix_sendmsg", bpf_attach_type::BPF_CGROUP_UNIX_SENDMSG),
];

/// The loaded Unix programs.
pub(crate) struct UnixPrograms {
    loaded: Vec<(&'static str, bpf_attach_type, OwnedFd)>,
}

impl UnixPrograms {
    /// Relocates and loads the programs of `object` onto the maps pinned in `maps_dir`; the
    /// error says why this kernel cannot run them.
    pub(super) fn load(object: &[u8], maps_dir: &Path) -> Result<Self, String> {
        let mut obj =
            aya_obj::Object::parse(object).map_err(|e| format!("parse the eBPF object: {e}"))?;
        let mut keys = HashSet::new();
        for (name, _) in PROGRAMS {
            let program = obj
                .programs
                .get(name)
                .ok_or_else(|| format!("the eBPF object has no {name}; rebuild toolwall"))?;
            keys.insert(program.function_key());
        }
        // Only these programs' code and the shared functions they may call (`.text`: memset and
        // memcpy) are relocated: the other programs use maps that are not pinned (aya-log's).
        let program_sections: HashSet<usize> =
            obj.programs.values().map(|p| p.section_index).collect();
        obj.functions
            .retain(|key, _| keys.contains(key) || !program_sections.contains(&key.0));
        obj.programs
            .retain(|name, _| PROGRAMS.iter().any(|(unix, _)| unix == name));
        let definitions = obj.maps.clone();
        let mut opened = Vec::new();
        for name in definitions.keys() {
            let pin = maps_dir.join(name);
            if !pin.exists() {
                continue;
            }
            let data = MapData::from_pin(&pin)
                .map_err(|e| format!("open the pinned map {}: {e}", pin.display()))?;
            opened.push((name.clone(), data));
        }
        let text_sections = obj.functions.keys().map(|(section, _)| *section).collect();
        // A shared function may refer to a map that is not pinned (aya-log's, `.rodata`): it
        // gets an invalid descriptor, which the kernel would refuse, so a Unix program that
        // came to use one fails to load rather than use another map.
        let fd_of = |name: &str| {
            opened
                .iter()
                .find(|(opened, _)| opened == name)
                .map_or(-1, |(_, data)| data.fd().as_fd().as_raw_fd())
        };
        obj.relocate_maps(
            definitions
                .iter()
                .map(|(name, definition)| (name.as_str(), fd_of(name), definition)),
            &text_sections,
        )
        .map_err(|e| format!("relocate the Unix socket programs: {e:?}"))?;
        obj.relocate_calls(&text_sections)
            .map_err(|e| format!("relocate the Unix socket programs: {e:?}"))?;
        let mut loaded = Vec::with_capacity(PROGRAMS.len());
        for (name, attach_type) in PROGRAMS {
            let key = obj.programs[name].function_key();
            let instructions = &obj.functions[&key].instructions;
            let fd = prog_load(name, attach_type, instructions).map_err(|e| {
                format!("the kernel refused {name} (cgroup Unix socket hooks need Linux 6.7 or later): {e}")
            })?;
            loaded.push((name, attach_type, fd));
        }
        Ok(Self { loaded })
    }

    /// The programs' names, in the order they attach.
    pub(super) fn names(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.loaded.iter().map(|(name, _, _)| *name)
    }

    /// Each program's runs and run time, as [`KernelMonitor::run_stats`] reports them.
    pub(super) fn run_stats(&self) -> Result<Vec<ProgramRunStats>, NetmonError> {
        self.loaded
            .iter()
            .map(|(name, _, fd)| {
                let (runs, nanos) = run_stats(fd).map_err(|source| NetmonError::Bpf {
                    what: format!("{name}: read its info"),
                    source,
                })?;
                Ok(ProgramRunStats {
                    program: name,
                    runs,
                    run_time: std::time::Duration::from_nanos(nanos),
                })
            })
            .collect()
    }

    /// Attaches program `name` to the cgroup `dir` through a bpf_link pinned at `pin`; `None`
    /// when `name` is not one of these programs.
    pub(super) fn attach(
        &self,
        name: &str,
        dir: &File,
        pin: &Path,
    ) -> Option<std::io::Result<PinnedLink>> {
        let (_, attach_type, prog) = self.loaded.iter().find(|(n, _, _)| *n == name)?;
        Some((|| {
            let link = link_create(prog, dir, *attach_type)?;
            obj_pin(&link, pin)?;
            PinnedLink::from_pin(pin).map_err(|e| std::io::Error::other(e.to_string()))
        })())
    }
}

/// The `bpf()` system call with `attr`; its non-negative return value.
fn sys(cmd: bpf_cmd, attr: &mut bpf_attr) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is a valid, zero-initialised bpf_attr of the size passed, filled in for
    // `cmd`; every pointer in it outlives the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            attr as *mut bpf_attr,
            size_of::<bpf_attr>(),
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(ret)
}

/// [`sys`] for a command that returns a new descriptor (BPF_PROG_LOAD, BPF_LINK_CREATE).
fn bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> std::io::Result<OwnedFd> {
    let fd = sys(cmd, attr)?;
    // SAFETY: these commands return a new descriptor we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A loaded program's run count and run time (BPF_OBJ_GET_INFO_BY_FD).
fn run_stats(prog: &OwnedFd) -> std::io::Result<(u64, u64)> {
    // SAFETY: an all-zero bpf_prog_info is a valid value of this plain C struct.
    let mut info: bpf_prog_info = unsafe { std::mem::zeroed() };
    // SAFETY: an all-zero bpf_attr is the documented empty request.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    attr.info.bpf_fd = prog.as_raw_fd() as u32;
    attr.info.info_len = size_of::<bpf_prog_info>() as u32;
    attr.info.info = &mut info as *mut bpf_prog_info as u64;
    sys(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok((info.run_cnt, info.run_time_ns))
}

fn prog_load(
    name: &str,
    attach_type: bpf_attach_type,
    instructions: &[aya_obj::generated::bpf_insn],
) -> std::io::Result<OwnedFd> {
    // Without a log first (a verbose log of a program that passes can overflow any buffer,
    // which fails the load with ENOSPC); with one only to say why it did not pass.
    prog_load_logged(name, attach_type, instructions, None).or_else(|e| {
        let mut log = vec![0u8; 1 << 20];
        match prog_load_logged(name, attach_type, instructions, Some(&mut log)) {
            Ok(fd) => Ok(fd),
            Err(_) => {
                let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
                let log = String::from_utf8_lossy(&log[..end]);
                let tail: Vec<&str> = log.lines().rev().take(6).collect();
                Err(std::io::Error::new(
                    e.kind(),
                    format!("{e}; the verifier's last words: {}", tail.join(" | ")),
                ))
            }
        }
    })
}

fn prog_load_logged(
    name: &str,
    attach_type: bpf_attach_type,
    instructions: &[aya_obj::generated::bpf_insn],
    log: Option<&mut [u8]>,
) -> std::io::Result<OwnedFd> {
    let license = c"Dual MIT/GPL";
    // SAFETY: an all-zero bpf_attr is the documented empty request.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: writing the prog-load member of the union.
    let load = unsafe { &mut attr.__bindgen_anon_3 };
    load.prog_type = bpf_prog_type::BPF_PROG_TYPE_CGROUP_SOCK_ADDR as u32;
    load.expected_attach_type = attach_type as u32;
    load.insns = instructions.as_ptr() as u64;
    load.insn_cnt = instructions.len() as u32;
    load.license = license.as_ptr() as u64;
    if let Some(log) = log {
        load.log_level = 1;
        load.log_buf = log.as_mut_ptr() as u64;
        load.log_size = log.len() as u32;
    }
    for (slot, byte) in load.prog_name.iter_mut().zip(name.bytes().take(15)) {
        *slot = byte as libc::c_char;
    }
    bpf(bpf_cmd::BPF_PROG_LOAD, &mut attr)
}

fn link_create(
    prog: &OwnedFd,
    cgroup: &File,
    attach_type: bpf_attach_type,
) -> std::io::Result<OwnedFd> {
    // SAFETY: an all-zero bpf_attr is the documented empty request.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    attr.link_create.__bindgen_anon_1.prog_fd = prog.as_raw_fd() as u32;
    attr.link_create.__bindgen_anon_2.target_fd = cgroup.as_raw_fd() as u32;
    attr.link_create.attach_type = attach_type as u32;
    bpf(bpf_cmd::BPF_LINK_CREATE, &mut attr)
}

fn obj_pin(fd: &OwnedFd, path: &Path) -> std::io::Result<()> {
    let path = CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    // SAFETY: an all-zero bpf_attr is the documented empty request.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    // SAFETY: writing the obj-pin member of the union.
    let pin = unsafe { &mut attr.__bindgen_anon_4 };
    pin.pathname = path.as_ptr() as u64;
    pin.bpf_fd = fd.as_raw_fd() as u32;
    sys(bpf_cmd::BPF_OBJ_PIN, &mut attr).map(drop)
}

/// [`ALWAYS_LISTED`] as keys.
fn always_listed() -> impl Iterator<Item = UnixName> + Clone {
    ALWAYS_LISTED.iter().filter_map(|name| UnixName::of(name))
}

impl KernelMonitor {
    /// Makes `UNIX_LISTED` hold exactly [`ALWAYS_LISTED`] and `names` (toolwall's API socket,
    /// `exec.allow_unix`): new entries first, so a name that stays listed is never briefly
    /// refused.
    pub fn sync_unix_listed(&mut self, names: &[UnixName]) -> Result<(), NetmonError> {
        let mut listed = self.unix_listed_map()?;
        let wanted = always_listed().chain(names.iter().copied()).map(|n| (n, 1));
        make_exactly(&mut listed, wanted, UNIX_LISTED_MAP)
    }

    /// Adds [`ALWAYS_LISTED`] at load, leaving the names a daemon before this one listed until
    /// [`Self::sync_unix_listed`] replaces them.
    pub(super) fn list_always_listed(&mut self) -> Result<(), NetmonError> {
        let mut listed = self.unix_listed_map()?;
        for name in always_listed() {
            listed
                .insert(name, 1, 0)
                .map_err(map_err(UNIX_LISTED_MAP))?;
        }
        Ok(())
    }

    fn unix_listed_map(&mut self) -> Result<HashMap<&mut MapData, UnixName, u32>, NetmonError> {
        let map = self
            .ebpf
            .map_mut(UNIX_LISTED_MAP)
            .ok_or(NetmonError::Missing("UNIX_LISTED map"))?;
        HashMap::try_from(map).map_err(map_err(UNIX_LISTED_MAP))
    }
}
