//! Signed policy bundles: one policy for many hosts, published once.
//!
//! A bundle is a JSON document — `{"format", "revision", "policy", "signature"}` — whose
//! `policy` is the text of a toolwall YAML file holding only `sandbox:` (the daemon's own
//! settings, listen addresses, store, kernel options, stay in each host's file), and whose
//! `signature` is an ed25519 signature over the format, the revision and the policy text
//! ([`signed_message`]). Revisions are numbers that only grow: a host refuses a bundle older
//! than the one it runs, so a replayed old bundle cannot roll a fleet's policy back.
//!
//! Nothing here does I/O: `toolwall policy keygen|sign|verify` (`cli/policy.rs`) and the
//! daemon's poller (`daemon/bundle.rs`) read and write the bytes.

use base64::Engine as _;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use super::{Config, ConfigError};

/// The `format` of the bundles this toolwall reads, and the start of every signed message.
pub(crate) const FORMAT: &str = "toolwall-policy-bundle/1";

/// Largest bundle read: a policy is at most a configuration file (`MAX_CONFIG_BYTES`), and
/// JSON escaping can double it.
pub(crate) const MAX_BUNDLE_BYTES: usize = 2 * super::MAX_CONFIG_BYTES + 4096;

const PUBLIC_PREFIX: &str = "ed25519:";
const SECRET_PREFIX: &str = "ed25519-secret:";

/// A bundle as published.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Bundle {
    /// [`FORMAT`].
    pub format: String,
    /// Grows with every publication.
    pub revision: u64,
    /// The YAML text (only `sandbox:`).
    pub policy: String,
    /// Base64 of the ed25519 signature over [`signed_message`].
    pub signature: String,
}

/// A bundle whose signature holds and whose policy passed every check `toolwall config check`
/// makes.
#[derive(Clone, Debug)]
pub(crate) struct Verified {
    /// The publisher's revision.
    pub revision: u64,
    /// The policy, parsed (every section but `sandbox:` at its default).
    pub config: Config,
    /// The bundle as received, to keep as the last good one.
    pub bytes: Vec<u8>,
}

/// Why a bundle was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BundleError {
    /// Too large to be a bundle.
    #[error("the bundle is {0} bytes, over the limit of {MAX_BUNDLE_BYTES}")]
    TooLarge(usize),
    /// Not the JSON of a bundle.
    #[error("not a toolwall policy bundle: {0}")]
    NotABundle(String),
    /// Signed for another format.
    #[error("bundle format {0:?} is not {FORMAT:?} (a newer toolwall's bundle?)")]
    Format(String),
    /// The signature does not hold for the configured key: tampered with, or signed by
    /// another key.
    #[error(
        "the signature does not verify with the configured public key (the bundle was changed after signing, or signed with another key)"
    )]
    Signature,
    /// The policy does not pass `config check`.
    #[error("the bundle's policy (revision {revision}) is invalid: {source}")]
    Policy {
        /// Its revision.
        revision: u64,
        /// What the check said.
        source: Box<ConfigError>,
    },
    /// The policy sets more than `sandbox:`.
    #[error(
        "the bundle's policy (revision {revision}) sets {sections}: a bundle carries only `sandbox:` (each host's own settings stay in its file)"
    )]
    Sections {
        /// Its revision.
        revision: u64,
        /// The other top-level keys.
        sections: String,
    },
}

/// The message a signature covers: the format, the revision and the policy text, so none of
/// them can be changed or moved to another bundle without breaking it.
pub(crate) fn signed_message(revision: u64, policy: &str) -> Vec<u8> {
    let mut message = format!("{FORMAT}\n{revision}\n").into_bytes();
    message.extend_from_slice(policy.as_bytes());
    message
}

/// Signs `policy` (YAML text, checked first: a publisher must not sign what hosts refuse).
pub(crate) fn sign(key: &SigningKey, revision: u64, policy: &str) -> Result<Bundle, BundleError> {
    check_policy(revision, policy)?;
    let signature = key.sign(&signed_message(revision, policy));
    Ok(Bundle {
        format: FORMAT.to_owned(),
        revision,
        policy: policy.to_owned(),
        signature: base64::engine::general_purpose::STANDARD.encode(signature.to_bytes()),
    })
}

/// Reads a bundle: bounded, strict JSON, the format, the signature (strict ed25519), then the
/// policy as `config check` reads a file.
pub(crate) fn open(bytes: &[u8], key: &VerifyingKey) -> Result<Verified, BundleError> {
    if bytes.len() > MAX_BUNDLE_BYTES {
        return Err(BundleError::TooLarge(bytes.len()));
    }
    let bundle: Bundle =
        serde_json::from_slice(bytes).map_err(|e| BundleError::NotABundle(e.to_string()))?;
    if bundle.format != FORMAT {
        return Err(BundleError::Format(bundle.format));
    }
    if bundle.revision == 0 {
        return Err(BundleError::NotABundle(
            "revision 0: revisions start at 1".into(),
        ));
    }
    let signature = base64::engine::general_purpose::STANDARD
        .decode(bundle.signature.trim())
        .ok()
        .and_then(|raw| <[u8; 64]>::try_from(raw.as_slice()).ok())
        .map(|raw| ed25519_dalek::Signature::from_bytes(&raw))
        .ok_or(BundleError::Signature)?;
    key.verify_strict(&signed_message(bundle.revision, &bundle.policy), &signature)
        .map_err(|_| BundleError::Signature)?;
    let config = check_policy(bundle.revision, &bundle.policy)?;
    Ok(Verified {
        revision: bundle.revision,
        config,
        bytes: bytes.to_vec(),
    })
}

/// The policy text as a configuration that holds `sandbox:` only.
fn check_policy(revision: u64, policy: &str) -> Result<Config, BundleError> {
    let origin = format!("policy bundle revision {revision}");
    let config = Config::parse(policy, &origin).map_err(|source| BundleError::Policy {
        revision,
        source: Box::new(source),
    })?;
    let mapping: serde_yaml_ng::Value = serde_yaml_ng::from_str(policy).unwrap_or_default();
    let others: Vec<String> = mapping
        .as_mapping()
        .map(|m| {
            m.keys()
                .filter_map(|k| k.as_str())
                .filter(|k| *k != "sandbox")
                .map(|k| format!("`{k}:`"))
                .collect()
        })
        .unwrap_or_default();
    if !others.is_empty() {
        return Err(BundleError::Sections {
            revision,
            sections: others.join(", "),
        });
    }
    Ok(config)
}

/// A public key as configured: `ed25519:BASE64` of its 32 bytes.
pub(crate) fn public_key(text: &str) -> Result<VerifyingKey, String> {
    let text = text.trim();
    let raw = text
        .strip_prefix(PUBLIC_PREFIX)
        .ok_or_else(|| format!("a public key starts with {PUBLIC_PREFIX:?}"))?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(raw)
        .map_err(|e| format!("not base64: {e}"))?;
    let bytes = <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| format!("{} bytes, an ed25519 public key has 32", bytes.len()))?;
    VerifyingKey::from_bytes(&bytes).map_err(|_| "not an ed25519 public key".to_owned())
}

/// A secret key file's text: `ed25519-secret:BASE64` of the 32-byte seed.
pub(crate) fn secret_key(text: &str) -> Result<SigningKey, String> {
    let raw = text
        .trim()
        .strip_prefix(SECRET_PREFIX)
        .ok_or_else(|| format!("a secret key file starts with {SECRET_PREFIX:?}"))?;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(raw)
        .map_err(|e| format!("not base64: {e}"))?;
    let seed = <[u8; 32]>::try_from(bytes.as_slice())
        .map_err(|_| format!("{} bytes, an ed25519 secret key has 32", bytes.len()))?;
    Ok(SigningKey::from_bytes(&seed))
}

/// A new key pair from the kernel's randomness: (secret key file text, public key text).
pub(crate) fn generate() -> std::io::Result<(String, String)> {
    let mut seed = [0u8; 32];
    // SAFETY: getrandom writes at most the length given into the buffer we own.
    let got = unsafe { libc::getrandom(seed.as_mut_ptr().cast(), seed.len(), 0) };
    if got != seed.len() as isize {
        return Err(std::io::Error::last_os_error());
    }
    let key = SigningKey::from_bytes(&seed);
    let b64 = base64::engine::general_purpose::STANDARD;
    Ok((
        format!("{SECRET_PREFIX}{}\n", b64.encode(seed)),
        public_text(&key.verifying_key()),
    ))
}

/// `ed25519:BASE64`.
pub(crate) fn public_text(key: &VerifyingKey) -> String {
    format!(
        "{PUBLIC_PREFIX}{}",
        base64::engine::general_purpose::STANDARD.encode(key.as_bytes())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = "sandbox:\n  mcp:\n    deny: ['^get-sum$']\n";

    fn keys() -> (SigningKey, VerifyingKey) {
        let (secret, public) = generate().expect("randomness");
        (
            secret_key(&secret).expect("secret"),
            public_key(&public).expect("public"),
        )
    }

    #[test]
    fn a_signed_bundle_opens_with_its_key_only() {
        let (secret, public) = keys();
        let bundle = sign(&secret, 3, POLICY).expect("sign");
        let bytes = serde_json::to_vec(&bundle).unwrap();
        let verified = open(&bytes, &public).expect("opens");
        assert_eq!(verified.revision, 3);
        assert_eq!(verified.config.sandbox.mcp.deny, ["^get-sum$"]);
        let (_, other) = keys();
        assert!(matches!(open(&bytes, &other), Err(BundleError::Signature)));
    }

    #[test]
    fn any_change_after_signing_breaks_the_signature() {
        let (secret, public) = keys();
        let bundle = sign(&secret, 3, POLICY).expect("sign");
        let changed = [
            Bundle {
                policy: POLICY.replace("get-sum", "get-summ"),
                ..bundle.clone()
            },
            Bundle {
                revision: 4,
                ..bundle.clone()
            },
            Bundle {
                signature: "AAAA".into(),
                ..bundle.clone()
            },
        ];
        for tampered in changed {
            let bytes = serde_json::to_vec(&tampered).unwrap();
            assert!(
                matches!(open(&bytes, &public), Err(BundleError::Signature)),
                "{tampered:?}"
            );
        }
        let mut value = serde_json::to_value(&bundle).unwrap();
        value["extra"] = "x".into();
        assert!(matches!(
            open(&serde_json::to_vec(&value).unwrap(), &public),
            Err(BundleError::NotABundle(_))
        ));
    }

    #[test]
    fn a_bundle_carries_a_valid_sandbox_and_nothing_else() {
        let (secret, _) = keys();
        let err = sign(&secret, 1, "sandbox:\n  mcp:\n    deny: ['(']\n").unwrap_err();
        assert!(err.to_string().contains("revision 1"), "{err}");
        let err = sign(&secret, 1, "api:\n  listen: 0.0.0.0:1\n").unwrap_err();
        assert!(err.to_string().contains("`api:`"), "{err}");
    }

    #[test]
    fn revision_zero_is_not_a_revision() {
        let (secret, public) = keys();
        let mut bundle = sign(&secret, 1, POLICY).expect("sign");
        bundle.revision = 0;
        bundle.signature = base64::engine::general_purpose::STANDARD
            .encode(secret.sign(&signed_message(0, POLICY)).to_bytes());
        let bytes = serde_json::to_vec(&bundle).unwrap();
        assert!(matches!(
            open(&bytes, &public),
            Err(BundleError::NotABundle(_))
        ));
    }

    #[test]
    fn keys_are_checked_when_read() {
        assert!(public_key("ed25519:AAAA").is_err());
        assert!(public_key("rsa:AAAA").is_err());
        assert!(secret_key("ed25519:AAAA").is_err());
    }
}
