//! Unix socket names as the `connect_unix` and `sendmsg_unix` programs key and report them.

use crate::connect::COMM_LEN;

/// Room for a name: `sun_path` of a `struct sockaddr_un`.
pub const NAME_BYTES: usize = 108;

/// A Unix socket address in one canonical form, so that every spelling the kernel treats as the
/// same socket is the same key.
///
/// A pathname is its bytes up to the first NUL (callers may or may not count a terminating NUL
/// in the address length, or pass the whole zero-padded `sockaddr_un`), `len` their count. An
/// abstract name starts with a NUL and is exactly the address length's bytes, NULs included.
/// The bytes past `len` are zero.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnixName {
    /// Bytes of `path` that are the name.
    pub len: u32,
    /// The name, zero-padded.
    pub path: [u8; NAME_BYTES],
}

impl UnixName {
    /// The empty name (an address the program could not read).
    pub const EMPTY: Self = Self {
        len: 0,
        path: [0; NAME_BYTES],
    };

    /// The key of `sun_path` bytes as a caller passes them (the address length less the
    /// family's two bytes); `None` when they do not fit.
    pub fn of(sun_path: &[u8]) -> Option<Self> {
        if sun_path.len() > NAME_BYTES {
            return None;
        }
        let len = if sun_path.first() == Some(&0) {
            sun_path.len()
        } else {
            sun_path
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(sun_path.len())
        };
        let mut name = Self::EMPTY;
        name.path[..len].copy_from_slice(&sun_path[..len]);
        name.len = len as u32;
        Some(name)
    }

    /// The name's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.path[..(self.len as usize).min(NAME_BYTES)]
    }
}

/// Map name of the Unix socket names every session may reach ([`UnixName`] → 1): toolwall's API
/// socket and `exec.allow_unix`.
pub const UNIX_LISTED_MAP: &str = "UNIX_LISTED";
/// Capacity of [`UNIX_LISTED_MAP`].
pub const MAX_UNIX_LISTED: u32 = 1024;

/// Names every session may reach whatever the configuration says: glibc's name service cache
/// (nscd), in both spellings of its path. Every glibc program that looks up a user, group or
/// host asks it first (bash does when `SHELL` is unset); it answers read-only from the databases
/// an agent can read in `/etc`, so refusing it would only record one refusal per lookup.
pub const ALWAYS_LISTED: [&[u8]; 2] = [b"/run/nscd/socket", b"/var/run/nscd/socket"];

/// One refused Unix socket connect or datagram, as the ring carries it (told apart from a
/// [`crate::connect::ConnectEvent`] by its size).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnixEvent {
    /// `bpf_ktime_get_ns()` at the call.
    pub ktime_ns: u64,
    /// Socket cookie of the caller's socket.
    pub cookie: u64,
    /// cgroup v2 id of the calling task.
    pub cgroup_id: u64,
    /// Process id (the kernel's tgid).
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Real uid of the task.
    pub uid: u32,
    /// [`crate::connect::HOOK_UNIX_CONNECT`] or [`crate::connect::HOOK_UNIX_SEND`].
    pub hook: u8,
    /// [`crate::connect::VERDICT_DENIED`].
    pub verdict: u8,
    /// Explicit padding.
    pub _pad: [u8; 2],
    /// Task `comm`, NUL-padded.
    pub comm: [u8; COMM_LEN],
    /// Where it went; [`UnixName::EMPTY`] when the address could not be read.
    pub name: UnixName,
}

const _: () = assert!(core::mem::size_of::<UnixName>() == 112);
const _: () = assert!(core::mem::size_of::<UnixEvent>() == 168);
const _: () = assert!(core::mem::align_of::<UnixEvent>() == 8);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spelling_of_a_pathname_is_one_key() {
        let bare = UnixName::of(b"/run/toolwall/api.sock").unwrap();
        let with_nul = UnixName::of(b"/run/toolwall/api.sock\0").unwrap();
        let mut padded = [0u8; NAME_BYTES];
        padded[..22].copy_from_slice(b"/run/toolwall/api.sock");
        assert_eq!(bare, with_nul);
        assert_eq!(bare, UnixName::of(&padded).unwrap());
        assert_eq!(bare.bytes(), b"/run/toolwall/api.sock");
    }

    #[test]
    fn an_abstract_name_keeps_its_length_and_nuls() {
        let short = UnixName::of(b"\0tmux").unwrap();
        let longer = UnixName::of(b"\0tmux\0").unwrap();
        assert_ne!(short, longer);
        assert_eq!(short.bytes(), b"\0tmux");
        assert!(UnixName::of(&[b'a'; NAME_BYTES + 1]).is_none());
    }
}
