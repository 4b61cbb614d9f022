//! The JSON-RPC the filter reads and writes: the error codes and responses it answers with,
//! the borrowed parse of a message's envelope and of a call's params, and batches taken
//! apart and put back together.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::Value;
use serde_json::value::RawValue;

/// JSON-RPC "Invalid params": what MCP servers answer for a tool that does not exist, and so
/// what a refused call gets (it must be indistinguishable from a missing tool).
pub(crate) const INVALID_PARAMS: i64 = -32602;

/// JSON-RPC "Parse error".
pub(crate) const PARSE_ERROR: i64 = -32700;

/// JSON-RPC "Invalid Request".
pub(crate) const INVALID_REQUEST: i64 = -32600;

#[derive(Deserialize)]
pub(super) struct Probe<'a> {
    #[serde(borrow, default)]
    pub(super) method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(super) params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(super) result: Option<&'a RawValue>,
}

#[derive(Deserialize)]
pub(super) struct CallParams<'a> {
    #[serde(borrow)]
    pub(super) name: Cow<'a, str>,
    #[serde(borrow, default)]
    pub(super) arguments: Option<&'a RawValue>,
}

/// The first byte that is not JSON whitespace.
pub(super) fn first_token(msg: &[u8]) -> Option<u8> {
    msg.iter()
        .copied()
        .find(|b| !matches!(b, b' ' | b'\t' | b'\r' | b'\n'))
}

/// A JSON-RPC error response; `id` is the raw id text of the request (`null` if unknown), so
/// the client sees its own id exactly as it wrote it.
pub(crate) fn error_response(id: &str, code: i64, message: &str) -> Vec<u8> {
    let message = serde_json::to_string(message).unwrap_or_else(|_| "\"\"".to_owned());
    format!(r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":{code},"message":{message}}}}}"#)
        .into_bytes()
}

/// The error a refused call gets: the MCP spec's unknown-tool error.
pub(crate) fn unknown_tool(id: &str, name: &str) -> Vec<u8> {
    error_response(id, INVALID_PARAMS, &format!("Unknown tool: {name}"))
}

/// Byte offset of `inner` inside `outer` (both from the same parse; `RawValue` borrows).
pub(super) fn offset_in(outer: &[u8], inner: &str) -> Option<usize> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    (start + inner.len() <= outer.len()).then_some(start)
}

/// `params._meta.progressToken` of a request (JSON text), if it has one.
pub(super) fn progress_token(params: Option<&RawValue>) -> Option<String> {
    let params: Value = serde_json::from_str(params?.get()).ok()?;
    let token = params.get("_meta")?.get("progressToken")?;
    (token.is_string() || token.is_number()).then(|| token.to_string())
}

/// Applies `one` to each batch element and reassembles the batch: the original bytes when
/// every element came back untouched, a new array of what is left otherwise, nothing when
/// nothing is left (an empty array is not a valid batch).
pub(super) fn batch<'a>(
    msg: &'a [u8],
    items: &[&'a RawValue],
    mut one: impl FnMut(&'a [u8]) -> Option<Cow<'a, [u8]>>,
) -> Option<Cow<'a, [u8]>> {
    let mut parts = Vec::with_capacity(items.len());
    let mut untouched = true;
    for item in items {
        let bytes = item.get().as_bytes();
        let part = one(bytes);
        untouched &= matches!(&part, Some(Cow::Borrowed(b)) if b.as_ptr() == bytes.as_ptr() && b.len() == bytes.len());
        parts.extend(part);
    }
    if untouched {
        return Some(Cow::Borrowed(msg));
    }
    if parts.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(msg.len());
    out.push(b'[');
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(part);
    }
    out.push(b']');
    Some(Cow::Owned(out))
}
