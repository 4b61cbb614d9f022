//! `telemetry:`: sending the record to a fleet's pipeline (OTLP export,
//! `daemon/otlp/mod.rs`).

use std::{collections::BTreeMap, path::PathBuf};

use serde::{Deserialize, Serialize};

use super::defaults::yes;

/// `telemetry:`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TelemetryConfig {
    /// `telemetry.otlp:` — OpenTelemetry export; none configured, nothing leaves the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp: Option<OtlpConfig>,
}

/// `telemetry.otlp:` — every stored event as an OTLP log record, every correlated call as a
/// span, read from the store behind a persisted cursor (at-least-once).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OtlpConfig {
    /// The collector: `http://host:4317` for grpc; for http/protobuf the base URL, to which
    /// `/v1/logs` and `/v1/traces` are added (as `OTEL_EXPORTER_OTLP_ENDPOINT` is read).
    pub endpoint: String,
    /// `grpc` or `http/protobuf`.
    #[serde(default)]
    pub protocol: OtlpProtocol,
    /// Sent with every export (gRPC metadata or HTTP headers), e.g. an API key.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// `tls: {ca_file}` — a PEM file of the CAs to trust for an `https://` endpoint instead of
    /// the system's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<OtlpTls>,
    /// Which event types leave as log records (empty: all). Spans are made from the call
    /// events whatever this says.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub events: Vec<String>,
    /// Export correlated calls as spans.
    #[serde(default = "yes")]
    pub spans: bool,
    /// Most events read and sent in one export.
    #[serde(default = "default_otlp_batch")]
    pub batch_size: usize,
    /// Milliseconds between looks at the store when it had nothing new.
    #[serde(default = "default_otlp_interval")]
    pub interval_ms: u64,
    /// Seconds one export may take before it counts as failed (and is sent again).
    #[serde(default = "default_otlp_timeout")]
    pub timeout_secs: u64,
}

/// `telemetry.otlp.protocol`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub(crate) enum OtlpProtocol {
    /// OTLP/gRPC (port 4317 by convention).
    #[default]
    #[serde(rename = "grpc")]
    Grpc,
    /// OTLP/HTTP with protobuf bodies (port 4318 by convention).
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

impl OtlpProtocol {
    /// As written in the configuration.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            OtlpProtocol::Grpc => "grpc",
            OtlpProtocol::HttpProtobuf => "http/protobuf",
        }
    }
}

/// `telemetry.otlp.tls`.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OtlpTls {
    /// PEM file of the CA certificates to trust.
    pub ca_file: PathBuf,
}

fn default_otlp_batch() -> usize {
    512
}

fn default_otlp_interval() -> u64 {
    1000
}

fn default_otlp_timeout() -> u64 {
    10
}
