//! `policy:`: where the policy comes from besides the file itself (a signed bundle pulled
//! from a URL, `config/bundle.rs`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `policy:`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PolicySourceConfig {
    /// `policy.bundle:` — a signed policy pulled from a URL; none, this file's `sandbox:` is
    /// the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle: Option<BundleConfig>,
}

/// `policy.bundle:` — the daemon pulls a bundle (`toolwall policy sign`), verifies its
/// ed25519 signature and applies its `sandbox:` to every layer without a restart
/// (`daemon/bundle.rs`).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BundleConfig {
    /// `https://` (or `http://`: the signature is what is trusted) URL of the bundle.
    pub url: String,
    /// The publisher's key, `ed25519:BASE64` as `toolwall policy keygen` writes it.
    pub public_key: String,
    /// Seconds between polls (with `If-None-Match`).
    #[serde(default = "default_poll_secs")]
    pub poll_secs: u64,
    /// PEM file of the CAs to trust for the bundle server instead of the system's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// The oldest revision this host accepts, for a host with no bundle kept yet (a new
    /// install): a replayed older bundle, validly signed, must not be its first.
    #[serde(default)]
    pub min_revision: u64,
}

fn default_poll_secs() -> u64 {
    60
}
