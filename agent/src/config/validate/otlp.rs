//! Validation of `telemetry.otlp`: an endpoint, headers and TLS settings the exporter can use.

use super::Check;
use crate::config::{ConfigError, OtlpConfig};

/// `telemetry.otlp`: what the exporter needs to be able to send at all.
pub(super) fn validate_otlp(check: &Check<'_>, otlp: &OtlpConfig) -> Result<(), ConfigError> {
    let at = "telemetry.otlp";
    let parsed =
        otlp.endpoint.parse::<http::Uri>().ok().filter(|uri| {
            matches!(uri.scheme_str(), Some("http" | "https")) && uri.host().is_some()
        });
    let Some(uri) = parsed else {
        return Err(check.error(
            format!("{at}.endpoint"),
            ("endpoint", otlp.endpoint.as_str(), 0),
            format!("{:?} is not an http:// or https:// URL", otlp.endpoint),
            "write the collector's URL, e.g. http://127.0.0.1:4317 (grpc) or http://127.0.0.1:4318 (http/protobuf)",
        ));
    };
    if otlp.tls.is_some() && uri.scheme_str() != Some("https") {
        return Err(check.error(
            format!("{at}.tls"),
            ("tls", "", 0),
            "tls is set but the endpoint is not https://",
            "use an https:// endpoint, or remove tls",
        ));
    }
    if let Some(tls) = &otlp.tls
        && let Err(error) = std::fs::metadata(&tls.ca_file)
    {
        return Err(check.error(
            format!("{at}.tls.ca_file"),
            ("ca_file", &tls.ca_file.display().to_string(), 0),
            format!("cannot read {}: {error}", tls.ca_file.display()),
            "name a PEM file of the CA certificates that signed the collector's certificate",
        ));
    }
    for (name, value) in &otlp.headers {
        if http::HeaderName::from_bytes(name.as_bytes()).is_err()
            || http::HeaderValue::from_str(value).is_err()
            || tonic_metadata_name(name).is_none()
        {
            return Err(check.error(
                format!("{at}.headers"),
                (name.as_str(), "", 0),
                format!("header {name:?} cannot be sent (a name or value with characters HTTP or gRPC forbids)"),
                "write lowercase header names of letters, digits and `-`, and values of visible ASCII",
            ));
        }
    }
    for (i, kind) in otlp.events.iter().enumerate() {
        if !crate::events::Event::KINDS.contains(&kind.as_str()) {
            return Err(check.error(
                format!("{at}.events[{i}]"),
                ("", kind.as_str(), 0),
                format!("{kind:?} is not an event type"),
                "use the types `toolwall events --type` takes, e.g. mcp_tool_called (or leave events out for all)",
            ));
        }
    }
    for (key, value, range, hint) in [
        (
            "batch_size",
            otlp.batch_size as u64,
            1..=10_000,
            "512 (the default) suits most collectors",
        ),
        (
            "interval_ms",
            otlp.interval_ms,
            50..=60_000,
            "1000 (the default)",
        ),
        (
            "timeout_secs",
            otlp.timeout_secs,
            1..=300,
            "10 (the default)",
        ),
    ] {
        if !range.contains(&value) {
            return Err(check.error(
                format!("{at}.{key}"),
                (key, &value.to_string(), 0),
                format!("must be between {} and {}", range.start(), range.end()),
                hint,
            ));
        }
    }
    Ok(())
}

/// gRPC metadata keys are lowercase ASCII (`-`, `_`, `.` allowed); `-bin` keys carry binary.
fn tonic_metadata_name(name: &str) -> Option<()> {
    (!name.is_empty()
        && !name.ends_with("-bin")
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b)))
    .then_some(())
}
