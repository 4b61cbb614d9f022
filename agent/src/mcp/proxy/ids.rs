//! The ids the proxy makes and reads: its own session ids, and the JSON-RPC ids of the
//! messages it relays (as canonical JSON text; compared as the peers compare them by
//! [`IdKey`](crate::mcp::filter::IdKey)).

use serde_json::Value;

pub(super) fn new_session_id() -> String {
    let mut bytes = [0u8; 16];
    // SAFETY: the buffer is valid for its length; getrandom writes at most that many bytes.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        // Unreachable on Linux ≥ 3.17 for 16 bytes; fall back to time and address entropy.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        bytes = (t ^ (&bytes as *const _ as u128)).to_le_bytes();
    }
    hex::encode(bytes)
}

/// The `id`s of the requests in a message (or batch), as canonical JSON text.
pub(super) fn request_ids(message: &[u8]) -> Vec<String> {
    let Ok(value) = serde_json::from_slice::<Value>(message) else {
        return Vec::new();
    };
    let items = match value {
        Value::Array(items) => items,
        single => vec![single],
    };
    items
        .iter()
        .filter(|m| m.get("method").is_some())
        .filter_map(|m| m.get("id").map(Value::to_string))
        .collect()
}

/// The `id` of a response, as canonical JSON text.
pub(super) fn response_id(message: &[u8]) -> Option<String> {
    let value = serde_json::from_slice::<Value>(message).ok()?;
    if value.get("method").is_some() {
        return None;
    }
    value.get("id").map(Value::to_string)
}
