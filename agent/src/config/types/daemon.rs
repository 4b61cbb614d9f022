//! `store:`, `api:` and `correlator:`: the daemon's own services (the event store, the local
//! query API, the joining of one call's events across layers).

use std::{net::SocketAddr, path::PathBuf};

use serde::{Deserialize, Serialize};

/// `store:`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StoreConfig {
    /// The SQLite database; see `config::default_store_path` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    /// What the layers do with an MCP tool call while the store cannot write (disk full,
    /// read-only): refuse it (`block`) or let it run while its events wait in memory (`queue`).
    #[serde(default)]
    pub on_failure: OnStoreFailure,
}

/// `store.on_failure`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum OnStoreFailure {
    /// A call that cannot be recorded does not run.
    #[default]
    Block,
    /// Calls run; their events wait in memory until the store writes again.
    Queue,
}

/// `api:` — the local query API.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ApiConfig {
    /// TCP listen address.
    #[serde(default = "default_api_listen")]
    pub listen: SocketAddr,
    /// Optional Unix socket path (permission-checked access instead of loopback TCP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<PathBuf>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            listen: default_api_listen(),
            socket: None,
        }
    }
}

fn default_api_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 18081))
}

/// `correlator:`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CorrelatorConfig {
    /// How far apart (ms) events of different layers may be and still be one call.
    #[serde(default = "default_window_ms")]
    pub window_ms: u64,
}

impl Default for CorrelatorConfig {
    fn default() -> Self {
        CorrelatorConfig {
            window_ms: default_window_ms(),
        }
    }
}

fn default_window_ms() -> u64 {
    2000
}
