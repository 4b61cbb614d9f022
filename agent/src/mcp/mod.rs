//! Layer 2: the MCP stdio shim and the MCP tool-filter proxy, and the MCP client the daemon
//! uses to discover network servers' tools.
//!
//! [`filter`] is sans-IO (bytes in, bytes out) over [`framing`] and [`sse`]; [`shim`],
//! [`proxy`] and [`client`] are the I/O around it; [`fuzzing`] is the oracle the randomised
//! tests and the `cargo fuzz` target (`agent/fuzz`) check it with.
//!
//! # Using them
//!
//! A stdio server behind the shim, in Claude Code's `.mcp.json` or Cursor's
//! `~/.cursor/mcp.json` (both use `mcpServers`):
//!
//! ```json
//! { "mcpServers": { "everything": {
//!     "command": "toolwall",
//!     "args": ["shim", "--server-id", "everything", "--deny", "^echo$",
//!              "--", "npx", "-y", "@modelcontextprotocol/server-everything"] } } }
//! ```
//!
//! or `claude mcp add everything -- toolwall shim --deny '^echo$' -- npx -y
//! @modelcontextprotocol/server-everything`.
//!
//! A network server behind the filter proxy:
//!
//! ```text
//! toolwall mcp-proxy --upstream http://127.0.0.1:3001/mcp --deny '^delete_,^drop_' --listen 127.0.0.1:8090
//! claude mcp add --transport http everything http://127.0.0.1:8090/mcp
//! claude mcp add --transport sse everything http://127.0.0.1:8090/sse
//! ```
//!
//! and in Cursor `{ "mcpServers": { "everything": { "url": "http://127.0.0.1:8090/mcp" } } }`.
//! Or let the agent spawn it: `"command": "toolwall", "args": ["mcp-proxy", "--stdio",
//! "--upstream", "http://127.0.0.1:3001/mcp", "--deny", "^echo$"]`.
//!
//! `--deny` patterns are regular expressions searched in the tool name (anchor them for exact
//! names); a value may hold several, separated by commas outside `{}`/`[]`/`()`. The regex
//! engine runs in linear time, so no pattern can backtrack catastrophically; patterns that
//! compile to more than 1 MiB are refused at start-up.

mod asking;
pub(crate) mod budget;
pub(crate) mod canonical;
pub(crate) mod client;
pub(crate) mod enforce;
pub(crate) mod filter;
pub(crate) mod filtered_sse;
#[cfg(feature = "fuzzing")]
pub(crate) mod fuzzing;
pub(crate) mod headers;
pub(crate) mod offload;
pub(crate) mod proxy;
pub(crate) mod relay;
pub(crate) mod shim;
pub(crate) mod stream_order;

/// The stdio transport's line framing lives below every layer (the approval client reads the
/// daemon's JSON lines with it too); MCP's modules reach it here as before.
pub(crate) use crate::framing;

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::FileTypeExt;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::unix::pipe;

/// A non-blocking duplicate of `fd` when it is a pipe or a socket (what agents connect stdio
/// servers with; Node uses socket pairs), else `None` (a terminal or a file cannot be polled).
fn pollable(fd: BorrowedFd<'_>) -> Option<File> {
    let file = File::from(fd.try_clone_to_owned().ok()?);
    if !is_pipe_or_socket(&file) {
        return None;
    }
    let raw = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own; F_GETFL/F_SETFL touch no memory.
    let ok = unsafe {
        let flags = libc::fcntl(raw, libc::F_GETFL);
        flags >= 0 && libc::fcntl(raw, libc::F_SETFL, flags | libc::O_NONBLOCK) >= 0
    };
    ok.then_some(file)
}

/// Whether `file` is a pipe or a socket (what can be polled).
pub(crate) fn is_pipe_or_socket(file: &File) -> bool {
    file.metadata()
        .map(|m| m.file_type())
        .is_ok_and(|kind| kind.is_fifo() || kind.is_socket())
}

/// Our stdin as an async reader. A pipe or socket is read through epoll; Tokio's own
/// `stdin()` hands every read to a blocking thread, which costs tens of microseconds per
/// message. Must be called inside a Tokio runtime.
pub(crate) fn async_stdin() -> Box<dyn AsyncRead + Unpin + Send> {
    match pollable(std::io::stdin().as_fd()).map(pipe::Receiver::from_file_unchecked) {
        Some(Ok(receiver)) => Box::new(receiver),
        _ => Box::new(tokio::io::stdin()),
    }
}

/// A descriptor another process handed over (a shim's stdin, `mcp/relay.rs`) as an async
/// reader: through epoll when it is a pipe or socket, else on blocking threads.
pub(crate) fn async_reader(fd: std::os::fd::OwnedFd) -> Box<dyn AsyncRead + Unpin + Send> {
    match pollable(fd.as_fd()).map(pipe::Receiver::from_file_unchecked) {
        Some(Ok(receiver)) => Box::new(receiver),
        _ => Box::new(tokio::fs::File::from_std(File::from(fd))),
    }
}

/// [`async_reader`] for writing (a shim's stdout).
pub(crate) fn async_writer(fd: std::os::fd::OwnedFd) -> Box<dyn AsyncWrite + Unpin + Send> {
    match pollable(fd.as_fd()).map(pipe::Sender::from_file_unchecked) {
        Some(Ok(sender)) => Box::new(sender),
        _ => Box::new(tokio::fs::File::from_std(File::from(fd))),
    }
}

/// Our stdout as an async writer, through epoll when it is a pipe or socket (see
/// [`async_stdin`]).
pub(crate) fn async_stdout() -> Box<dyn AsyncWrite + Unpin + Send> {
    match pollable(std::io::stdout().as_fd()).map(pipe::Sender::from_file_unchecked) {
        Some(Ok(sender)) => Box::new(sender),
        _ => Box::new(tokio::io::stdout()),
    }
}
