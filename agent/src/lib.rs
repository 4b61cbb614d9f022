//! toolwall: decides which MCP tools an AI agent may call, enforces it before they run, and
//! records every call, at three layers (LLM interceptor, MCP shim/proxy, kernel connect hooks).
//!
//! The binary `toolwall` is a thin shell over [`cli`]; everything else is a library so the
//! end-to-end tests and benchmarks can drive the same code.

pub mod cgroup;
pub mod cli;
pub mod client;
pub mod config;
pub mod correlate;
pub mod daemon;
pub mod decision;
mod edge;
pub mod events;
pub mod exec;
pub mod llm;
pub mod mcp;
pub mod netmon;
pub mod policy;
pub mod registry;
mod seccomp;
mod sse;
pub mod views;
