//! Kernel network monitor: loads toolwall's `cgroup/connect4`, `connect6`, `sendmsg4`,
//! `sendmsg6`, `post_bind4`, `post_bind6` and `sock_create` programs, attaches them to session
//! cgroups (pinned, see [`pins`]), keeps their rule maps in sync and reads their events.
//!
//! The object is embedded at build time (see `agent/build.rs`); a build made without the BPF
//! toolchain embeds an empty object, and [`KernelMonitor::load`] says so instead of failing
//! obscurely.

pub(crate) mod boundary;
pub(crate) mod events;
mod loader;
pub(crate) mod local;
pub(crate) mod pins;
pub(crate) mod routes;
pub(crate) mod rules;
pub(crate) mod service;

pub use loader::KernelMonitor;
pub(crate) use loader::{Counters, NetmonError};
pub use rules::{Rule, RuleAction};
