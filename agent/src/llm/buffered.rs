//! Whole (non-streaming) response bodies: blocked calls replaced, everything else verbatim.
//!
//! Every tool call in the body is looked at, whatever the stop/finish reason says (a forced tool
//! call can come with `stop`). Only the objects on the path to a changed value are rebuilt
//! ([`RawObject`](super::json::RawObject)); all other bytes are upstream's.
//!
//! Each dialect's rewrite (`rewrite_body`) sits beside its stream machine (`anthropic.rs`,
//! `chat.rs`, `responses.rs`, `gemini/`); this module picks the dialect and applies the malformed-body
//! policy.

use std::sync::Arc;

use super::{Cx, Dialect, OnMalformed, Record, anthropic, chat, gemini, responses};
use crate::decision::Gate;

/// Why a buffered body could not be inspected.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BufferedError {
    /// The body is not the JSON the dialect defines, and the policy is to fail closed.
    #[error("response body is not valid {dialect} JSON: {source}")]
    Malformed {
        /// The dialect expected.
        dialect: &'static str,
        /// The parse error.
        source: serde_json::Error,
    },
    /// A body or call that cannot be judged as it stands (whatever `on_malformed` says).
    #[error("{0}")]
    Unjudgeable(String),
}

/// Inspects a complete response body. Returns the new body when something was blocked (`None`:
/// send the original bytes), and the decisions made, to record.
pub(crate) fn rewrite_buffered(
    dialect: Dialect,
    body: &[u8],
    gate: Arc<dyn Gate>,
    on_malformed: OnMalformed,
) -> Result<(Option<Vec<u8>>, Vec<Record>), BufferedError> {
    let mut cx = Cx {
        gate,
        dialect,
        on_malformed,
        records: Vec::new(),
    };
    // Not UTF-8 is no broken body to pass under fail_open: Python's `json.loads` reads UTF-16
    // and UTF-32 bodies (it tells them by their NUL bytes, which UTF-8 JSON never holds raw),
    // which toolwall's reading (and the backstop's search) cannot.
    let text = std::str::from_utf8(body)
        .ok()
        .filter(|text| !text.contains('\0'))
        .ok_or_else(|| {
            BufferedError::Unjudgeable(format!(
                "the {} response body is not UTF-8 JSON text, and a client may still decode it (as UTF-16 or UTF-32) into calls toolwall cannot read",
                dialect.as_str()
            ))
        });
    let result = text.and_then(|text| {
        let r = match dialect {
            Dialect::Anthropic => anthropic::rewrite_body(&mut cx, text),
            Dialect::OpenAiChat => chat::rewrite_body(&mut cx, text),
            Dialect::OpenAiResponses => responses::rewrite_body(&mut cx, text),
            Dialect::Gemini => {
                return gemini::rewrite_document(&mut cx, text).map_err(|e| match e {
                    gemini::Unpassable::Json(source) => BufferedError::Malformed {
                        dialect: dialect.as_str(),
                        source,
                    },
                    gemini::Unpassable::Unjudgeable(why) => BufferedError::Unjudgeable(why),
                });
            }
        };
        r.map_err(|source| BufferedError::Malformed {
            dialect: dialect.as_str(),
            source,
        })
    });
    match result {
        Ok(new) => Ok((new.map(String::into_bytes), cx.records)),
        Err(e @ BufferedError::Unjudgeable(_)) => Err(e),
        Err(e) if on_malformed == OnMalformed::FailOpen => {
            tracing::warn!(error = %e, "passing a malformed body (fail_open)");
            Ok((None, cx.records))
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests;
