//! Wire types shared by the kernel programs (`agent-ebpf`) and the daemon (`agent`).
//!
//! Every type here is `#[repr(C)]` and has its size pinned by a compile-time assertion, so the
//! two sides (built by different compilers for different targets) can never disagree on a
//! layout without the build failing. The `user` feature adds `aya::Pod` impls for map use.
#![no_std]

pub mod connect;
pub mod counters;
pub mod rule;
pub mod summary;
pub mod unix;

#[cfg(feature = "user")]
mod user;
