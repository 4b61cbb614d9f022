//! Validation of `policy.bundle`: where the daemon pulls a signed policy from.

use super::Check;
use crate::config::{BundleConfig, ConfigError};

/// `policy.bundle`: a URL to poll, a key that parses, a sane interval.
pub(super) fn validate_bundle(check: &Check<'_>, bundle: &BundleConfig) -> Result<(), ConfigError> {
    let at = "policy.bundle";
    let parsed =
        bundle.url.parse::<http::Uri>().ok().filter(|uri| {
            matches!(uri.scheme_str(), Some("http" | "https")) && uri.host().is_some()
        });
    if parsed.is_none() {
        return Err(check.error(
            format!("{at}.url"),
            ("url", bundle.url.as_str(), 0),
            format!("{:?} is not an http:// or https:// URL", bundle.url),
            "write the bundle's full URL, e.g. https://policy.example.com/toolwall/bundle.json",
        ));
    }
    if let Err(why) = crate::config::bundle::public_key(&bundle.public_key) {
        return Err(check.error(
            format!("{at}.public_key"),
            ("public_key", bundle.public_key.as_str(), 0),
            why,
            "paste the publisher's key file as `toolwall policy keygen` wrote it (ed25519:BASE64)",
        ));
    }
    if !(5..=86_400).contains(&bundle.poll_secs) {
        return Err(check.error(
            format!("{at}.poll_secs"),
            ("poll_secs", &bundle.poll_secs.to_string(), 0),
            "must be between 5 and 86400",
            "60 (the default) follows a new revision within a minute",
        ));
    }
    if let Some(ca) = &bundle.ca_file
        && let Err(error) = std::fs::metadata(ca)
    {
        return Err(check.error(
            format!("{at}.ca_file"),
            ("ca_file", &ca.display().to_string(), 0),
            format!("cannot read {}: {error}", ca.display()),
            "name a PEM file of the CA certificates that signed the bundle server's certificate",
        ));
    }
    Ok(())
}
