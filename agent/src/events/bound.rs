//! What may enter the record: JSON values that every reader can read back (a tool call whose
//! arguments nest 127 deep, once stored, makes every view fail from then on, on serde_json's
//! recursion limit of 128 — and the model decides those bytes).
//!
//! A value nested deeper than [`MAX_DEPTH`] or larger than [`MAX_BYTES`] is stored as a marker
//! object naming what was cut and the SHA-256 of the original (its compact JSON), so the
//! record says that something was there, how it was judged (the event keeps its decision), and
//! can be matched against the original elsewhere — never the unbounded bytes.

use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

/// Deepest nesting kept below a value's root. The event around it adds a few levels; the
/// readers' limit is 128.
pub(crate) const MAX_DEPTH: usize = 32;
/// Largest value kept, as compact JSON.
pub(crate) const MAX_BYTES: usize = 256 * 1024;

/// `value` bounded in depth and size; `None` when it already was (nothing to change). One walk
/// measures both, without serializing: the store calls this for every event, and only a value
/// that is cut is serialized (for its hash).
pub(crate) fn bounded(value: &Value) -> Option<Value> {
    let (too_deep, size) = measure(value, MAX_DEPTH);
    if !too_deep && size <= MAX_BYTES {
        return None;
    }
    let text = serde_json::to_string(value).unwrap_or_default();
    let sha256 = hex(&Sha256::digest(text.as_bytes()));
    let why = if too_deep {
        format!("nested deeper than {MAX_DEPTH} levels")
    } else {
        format!("{} bytes, over {MAX_BYTES}", text.len())
    };
    let mut marker = Map::new();
    marker.insert("toolwall_truncated".into(), json!(why));
    marker.insert("sha256".into(), json!(sha256));
    marker.insert("bytes".into(), json!(text.len()));
    Some(Value::Object(marker))
}

/// About the memory `value` holds (its nodes, strings and keys), for the event queue's bound
/// (`events/mod.rs`). Walks the whole value: a count that stopped early, at a deep branch or
/// past [`MAX_BYTES`], would let parsed arguments many times their weight through (262 calls
/// weighed at 204 KB can hold 877 MB).
pub(crate) fn memory_hint(value: &Value) -> usize {
    const NODE: usize = std::mem::size_of::<Value>();
    let mut size = 0usize;
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        size += NODE;
        match v {
            Value::String(s) => size += s.len(),
            Value::Array(items) => stack.extend(items.iter()),
            Value::Object(map) => {
                for (k, c) in map {
                    // The key's string and the map's entry.
                    size += k.len() + 3 * std::mem::size_of::<usize>();
                    stack.push(c);
                }
            }
            _ => {}
        }
    }
    size
}

/// The marker for a value that arrives as JSON text over [`MAX_BYTES`] (a `tools/call`'s
/// `arguments`), made without parsing it: parsed, 14 MiB of `[0,0,…]` became 16 times that in
/// memory before the store could cut it. `None` when the text is within bounds. Its SHA-256 is
/// of the text itself (what the server received), not of [`bounded`]'s re-serialisation, so
/// the correlator compares no cut arguments ([`is_marker`]).
pub(crate) fn marker_for_text(text: &str) -> Option<Value> {
    if text.len() <= MAX_BYTES {
        return None;
    }
    let mut marker = Map::new();
    marker.insert(
        "toolwall_truncated".into(),
        json!(format!("{} bytes, over {MAX_BYTES}", text.len())),
    );
    marker.insert(
        "sha256".into(),
        json!(hex(&Sha256::digest(text.as_bytes()))),
    );
    marker.insert("bytes".into(), json!(text.len()));
    Some(Value::Object(marker))
}

/// A marker for arguments whose text is not a value the record can keep (a lone surrogate
/// escape, `"\ud800"`, which the SDKs read and serde_json refuses): kept as a marker with the text's hash, so that, like cut
/// arguments, they are compared with nothing ([`is_marker`]) rather than recorded as absent.
pub(crate) fn marker_for_unreadable(text: &str, why: &serde_json::Error) -> Value {
    let mut marker = Map::new();
    marker.insert(
        "toolwall_truncated".into(),
        json!(format!("not a value the record can keep: {why}")),
    );
    marker.insert(
        "sha256".into(),
        json!(hex(&Sha256::digest(text.as_bytes()))),
    );
    marker.insert("bytes".into(), json!(text.len()));
    Value::Object(marker)
}

/// Whether `value` is a marker of cut arguments: two sides of one call cut theirs from
/// different texts, so their markers tell nothing about whether the arguments agree.
pub(crate) fn is_marker(value: &Value) -> bool {
    value.get("toolwall_truncated").is_some()
}

/// Whether `value` nests more than `limit` levels, and a lower bound of its compact JSON size
/// (strings and keys counted unescaped, with their quotes), in one walk; iterative, since the
/// input may be deep. Stops counting once past [`MAX_BYTES`].
fn measure(value: &Value, limit: usize) -> (bool, usize) {
    let mut size = 0usize;
    let mut stack = vec![(value, 0usize)];
    while let Some((v, depth)) = stack.pop() {
        if size > MAX_BYTES {
            break;
        }
        match v {
            Value::String(s) => size += s.len() + 2,
            Value::Array(items) => {
                if depth >= limit && !items.is_empty() {
                    return (true, size);
                }
                size += 2 + items.len();
                stack.extend(items.iter().map(|c| (c, depth + 1)));
            }
            Value::Object(map) => {
                if depth >= limit && !map.is_empty() {
                    return (true, size);
                }
                size += 2 + map.len() * 2;
                for (k, c) in map {
                    size += k.len() + 2;
                    stack.push((c, depth + 1));
                }
            }
            other => size += other.to_string().len(),
        }
    }
    (false, size)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize) -> Value {
        let mut v = json!(1);
        for _ in 0..depth {
            v = json!([v]);
        }
        v
    }

    #[test]
    fn deep_and_large_values_become_markers_with_the_hash() {
        assert_eq!(bounded(&nested(MAX_DEPTH)), None);
        let deep = bounded(&nested(127)).expect("cut");
        assert_eq!(deep["toolwall_truncated"], "nested deeper than 32 levels");
        assert_eq!(deep["sha256"].as_str().map(str::len), Some(64));
        let large = json!({ "s": "x".repeat(MAX_BYTES) });
        assert!(memory_hint(&large) > MAX_BYTES);
        let cut = bounded(&large).expect("cut");
        assert!(
            cut["toolwall_truncated"]
                .as_str()
                .is_some_and(|w| w.contains("over"))
        );
        assert_eq!(bounded(&json!({"path": "/tmp/x"})), None);
    }
}

#[cfg(test)]
mod memory_tests {
    use super::*;

    /// A deep branch last in an array is walked first; the siblings before it still count.
    #[test]
    fn memory_hint_counts_every_node_whatever_comes_first() {
        let mut deep = json!(0);
        for _ in 0..40 {
            deep = json!([deep]);
        }
        let wide = Value::Array(vec![json!(0); 65_537]);
        let value = json!({ "a": [wide, deep] });
        assert!(
            memory_hint(&value) >= 65_537 * std::mem::size_of::<Value>(),
            "{}",
            memory_hint(&value)
        );
    }
}
