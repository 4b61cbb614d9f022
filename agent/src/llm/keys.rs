//! The pre-filters' key sets: which events (or runs of events) must be parsed at all.
//!
//! An event that contains none of a dialect's tool keys cannot carry a tool call, so it passes
//! unparsed. Each key is a memchr `memmem` searcher (SIMD, ~10 GB/s here for a set of four over
//! text-heavy SSE, where a general multi-pattern automaton managed ~1 GB/s: every `"` is a
//! candidate start for it), which lets a whole run of text events be forwarded after one scan.

use memchr::memmem::Finder;

/// A set of literal keys, always with the JSON `\u` escape among them: `"\u0074ool_use"` is
/// `"tool_use"` to every JSON parser, so any key may hide behind an escape, and an escape counts
/// as a mention.
pub(crate) struct Keys(Vec<Finder<'static>>);

impl Keys {
    /// The set of `keys` and `\u`.
    pub(crate) fn new(keys: &[&str]) -> Keys {
        let all = keys.iter().copied().chain(std::iter::once("\\u"));
        Keys(
            all.map(|k| Finder::new(k.as_bytes()).into_owned())
                .collect(),
        )
    }

    /// Where the leftmost key in `hay` starts.
    pub(crate) fn find(&self, hay: &[u8]) -> Option<usize> {
        let mut best: Option<usize> = None;
        for key in &self.0 {
            // Only a match starting before the best so far matters.
            let window = best.map_or(hay.len(), |b| (b + key.needle().len()).min(hay.len()));
            if let Some(at) = key.find(&hay[..window])
                && best.is_none_or(|b| at < b)
            {
                best = Some(at);
            }
        }
        best
    }

    /// Whether `hay` mentions any key (or holds an escape).
    pub(crate) fn any_in(&self, hay: &[u8]) -> bool {
        self.0.iter().any(|key| key.find(hay).is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::Keys;

    #[test]
    fn finds_the_leftmost_key_or_escape() {
        let keys = Keys::new(&["\"tool_use\"", "\"message_delta\""]);
        assert_eq!(keys.find(br#"{"type":"text"}"#), None);
        assert!(!keys.any_in(br#"{"type":"tool_use_x"}"#));
        assert_eq!(
            keys.find(br#"{"a":"message_delta","b":"tool_use"}"#),
            Some(5)
        );
        assert_eq!(keys.find(br#"{"type":"\u0074ool_use"}"#), Some(9));
        assert!(keys.any_in(br#"x"tool_use""#));
        // The leftmost wins whatever the order of the keys.
        assert_eq!(
            keys.find(br#"{"a":"tool_use","b":"message_delta"}"#),
            Some(5)
        );
        assert_eq!(keys.find(br#""tool_use"\u"#), Some(0));
    }
}
