//! Kernel network monitor: loads toolwall's `cgroup/connect4`, `connect6`, `sendmsg4` and
//! `sendmsg6` programs, attaches them to session cgroups (pinned, see [`pins`]), keeps their
//! rule maps in sync and reads their events.
//!
//! The object is embedded at build time (see `agent/build.rs`); a build made without the BPF
//! toolchain embeds an empty object, and [`KernelMonitor::load`] says so instead of failing
//! obscurely.

pub mod events;
mod loader;
pub mod local;
pub mod pins;
pub mod rules;
pub mod service;

pub use loader::{Counters, KernelMonitor, NetmonError, PROGRAMS, ProgramRunStats, ebpf_object};
pub use rules::{Rule, RuleAction};
