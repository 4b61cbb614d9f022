//! Editing JSON without re-serialising what we did not change.
//!
//! An event or body that needs a rewrite is parsed one level at a time into [`RawObject`]s whose
//! values stay the raw text they came in as (`serde_json::value::RawValue`); only the values we
//! replace are new, so every other field (and all nested data, numbers, escapes) leaves exactly as
//! upstream wrote it. Key order is kept, unlike `serde_json::Map` (a `BTreeMap` here).

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{MapAccess, Visitor};
use serde_json::value::RawValue;

/// A JSON object as an ordered list of keys and raw values.
#[derive(Debug, Clone, Default)]
pub(crate) struct RawObject<'a> {
    entries: Vec<(String, Cow<'a, RawValue>)>,
}

impl<'a> RawObject<'a> {
    /// Parses one object, borrowing its values from `text`.
    pub(crate) fn parse(text: &'a str) -> serde_json::Result<Self> {
        serde_json::from_str(text)
    }

    /// Parses one object from a raw value.
    pub(crate) fn from_raw(raw: &'a RawValue) -> serde_json::Result<Self> {
        Self::parse(raw.get())
    }

    /// The raw value of `key`.
    pub(crate) fn get(&self, key: &str) -> Option<&RawValue> {
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_ref())
    }

    /// The value of `key` as parsed (not one set since), borrowed for the input's lifetime so
    /// the object can be edited while it is in use.
    pub(crate) fn parsed(&self, key: &str) -> Option<&'a RawValue> {
        self.entries
            .iter()
            .find(|(k, _)| k == key)
            .and_then(|(_, v)| match v {
                Cow::Borrowed(b) => Some(*b),
                Cow::Owned(_) => None,
            })
    }

    /// The value of `key` as a string, if it is one.
    pub(crate) fn get_str(&self, key: &str) -> Option<String> {
        self.get(key)
            .and_then(|v| serde_json::from_str::<String>(v.get()).ok())
    }

    /// Replaces `key`'s value in place, or appends the key.
    pub(crate) fn set(&mut self, key: &str, value: Box<RawValue>) {
        match self.entries.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = Cow::Owned(value),
            None => self.entries.push((key.to_owned(), Cow::Owned(value))),
        }
    }

    /// Removes `key` if present.
    pub(crate) fn remove(&mut self, key: &str) {
        self.entries.retain(|(k, _)| k != key);
    }

    /// Serialises, values verbatim.
    pub(crate) fn to_json(&self) -> String {
        let mut out = String::with_capacity(
            2 + self
                .entries
                .iter()
                .map(|(k, v)| k.len() + v.get().len() + 4)
                .sum::<usize>(),
        );
        out.push('{');
        for (i, (k, v)) in self.entries.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&quote(k));
            out.push(':');
            out.push_str(v.get());
        }
        out.push('}');
        out
    }

    /// Serialises into a raw value.
    pub(crate) fn to_raw(&self) -> Box<RawValue> {
        raw_from_json(self.to_json())
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for RawObject<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = RawObject<'a>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Self::Value, M::Error> {
                let mut entries = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, &'de RawValue>()? {
                    // Parsers disagree on repeated keys (we would read the first, the SDKs'
                    // JSON.parse / json.loads keep the last): refuse such an object, so it goes
                    // down the malformed path instead of being half-inspected.
                    if entries
                        .iter()
                        .any(|(seen, _): &(String, Cow<'_, RawValue>)| *seen == k)
                    {
                        return Err(serde::de::Error::custom(format!("duplicate key {k:?}")));
                    }
                    entries.push((k, Cow::Borrowed(v)));
                }
                Ok(RawObject { entries })
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// A JSON string literal for `s`.
pub(crate) fn quote(s: &str) -> String {
    // Serialising a &str cannot fail.
    serde_json::to_string(s).unwrap_or_else(|_| String::from("\"\""))
}

/// Wraps text we built ourselves (always valid JSON) as a raw value.
pub(crate) fn raw_from_json(json: String) -> Box<RawValue> {
    RawValue::from_string(json).unwrap_or_else(|_| raw_null())
}

/// A raw string value.
pub(crate) fn raw_str(s: &str) -> Box<RawValue> {
    raw_from_json(quote(s))
}

/// The raw value `null`.
pub(crate) fn raw_null() -> Box<RawValue> {
    RawValue::NULL.to_owned()
}

/// Joins raw values into a raw array.
pub(crate) fn raw_array<'v>(items: impl IntoIterator<Item = &'v RawValue>) -> Box<RawValue> {
    let mut out = String::from("[");
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(item.get());
    }
    out.push(']');
    raw_from_json(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untouched_values_stay_verbatim_and_order_is_kept() {
        let text = r#"{"z":1.50,"a":{"b" : [1, 2]},"s":"\u00e9"}"#;
        let mut obj = RawObject::parse(text).expect("object");
        assert_eq!(
            obj.to_json(),
            r#"{"z":1.50,"a":{"b" : [1, 2]},"s":"\u00e9"}"#
        );
        obj.set("z", raw_str("x"));
        obj.remove("a");
        obj.set("n", raw_null());
        assert_eq!(obj.to_json(), r#"{"z":"x","s":"\u00e9","n":null}"#);
        assert_eq!(obj.get_str("s").as_deref(), Some("é"));
    }
}

#[cfg(test)]
mod duplicate_key_tests {
    use super::RawObject;

    #[test]
    fn an_object_with_a_repeated_key_is_refused() {
        let err = RawObject::parse(r#"{"choices":[1],"choices":[2]}"#).unwrap_err();
        assert!(err.to_string().contains("duplicate key"), "{err}");
        assert!(
            RawObject::parse(r#"{"a":1,"b":{"a":2}}"#).is_ok(),
            "the same key at another level is fine"
        );
    }
}
