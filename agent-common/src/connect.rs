//! The event a connect, sendmsg, bind or Unix socket program sends to user space through the
//! `EVENTS` ring buffer.

/// Length of the task's `comm`, as in the kernel's `TASK_COMM_LEN`.
pub const COMM_LEN: usize = 16;

/// What the program did with the connect.
pub const VERDICT_FLAGGED: u8 = 1;
/// The connect was refused with EPERM.
pub const VERDICT_DENIED: u8 = 2;

/// The event came from `connect()` (`cgroup/connect4`/`connect6`).
pub const HOOK_CONNECT: u8 = 1;
/// The event came from a datagram sent with an address (`cgroup/sendmsg4`/`sendmsg6`).
pub const HOOK_SENDMSG: u8 = 2;
/// The event came from a `bind()` that got its port (`cgroup/post_bind4`/`post_bind6`); the
/// address and port are the ones bound.
pub const HOOK_BIND: u8 = 3;

/// The event came from a Unix socket `connect()` (`cgroup/connect_unix`): a
/// [`crate::unix::UnixEvent`].
pub const HOOK_UNIX_CONNECT: u8 = 4;
/// The event came from a Unix datagram sent to an address (`cgroup/sendmsg_unix`): a
/// [`crate::unix::UnixEvent`].
pub const HOOK_UNIX_SEND: u8 = 5;

/// `AF_UNIX`, as the kernel spells it. A summary of Unix refusals (which has no room for the
/// whole name) carries the name's first sixteen bytes as its address and its length as its port.
pub const FAMILY_UNIX: u16 = 1;
/// `AF_INET`, as the kernel spells it.
pub const FAMILY_INET: u16 = 2;
/// `AF_INET6`, as the kernel spells it.
pub const FAMILY_INET6: u16 = 10;

/// One matched `connect()`, as seen in the kernel.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectEvent {
    /// `bpf_ktime_get_ns()` at the connect (monotonic, boot-relative).
    pub ktime_ns: u64,
    /// Socket cookie: stable id of the socket, joins several events of one socket.
    pub cookie: u64,
    /// cgroup v2 id (inode number of the cgroup directory) of the connecting task.
    pub cgroup_id: u64,
    /// Process id (the kernel's tgid).
    pub pid: u32,
    /// Thread id (the kernel's pid).
    pub tid: u32,
    /// Real uid of the task.
    pub uid: u32,
    /// Index of the matched server in the daemon's server table.
    pub server_index: u32,
    /// Destination address: IPv6, or IPv4-mapped for `AF_INET`, network byte order.
    pub addr: [u8; 16],
    /// Destination port, host byte order.
    pub port: u16,
    /// Socket family the process used: [`FAMILY_INET`] or [`FAMILY_INET6`].
    pub family: u16,
    /// IP protocol: 6 TCP, 17 UDP.
    pub protocol: u8,
    /// [`VERDICT_FLAGGED`] or [`VERDICT_DENIED`].
    pub verdict: u8,
    /// [`HOOK_CONNECT`], [`HOOK_SENDMSG`] or [`HOOK_BIND`].
    pub hook: u8,
    /// Explicit padding.
    pub _pad: [u8; 5],
    /// Task `comm`, NUL-padded.
    pub comm: [u8; COMM_LEN],
}

/// Map name of the event ring buffer.
pub const EVENTS_MAP: &str = "EVENTS";
/// Size of the event ring buffer in bytes (a power of two, a multiple of the page size).
pub const RING_BYTES: u32 = 256 * 1024;

const _: () = assert!(core::mem::size_of::<ConnectEvent>() == 88);
const _: () = assert!(core::mem::align_of::<ConnectEvent>() == 8);
