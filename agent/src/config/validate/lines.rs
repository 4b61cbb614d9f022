//! Finding the line of a rejected value in the source text, which serde does not keep.

/// The 1-based line of the `nth` (0-based) occurrence of `key: value` in `source` (list
/// markers and quotes ignored; `key` empty means a bare list item `- value`, `value` empty
/// means any value). Falls back to the first line containing `value`.
pub(crate) fn find_line(source: &str, key: &str, value: &str, nth: usize) -> Option<usize> {
    let mut seen = 0;
    for (i, line) in source.lines().enumerate() {
        let mut text = line.trim_start();
        let mut was_item = false;
        while let Some(rest) = text.strip_prefix("- ") {
            text = rest.trim_start();
            was_item = true;
        }
        let found = if key.is_empty() {
            was_item && unquote(text) == value
        } else {
            match text.strip_prefix(key).map(str::trim_start) {
                Some(rest) => match rest.strip_prefix(':') {
                    Some(v) => value.is_empty() || unquote(v.trim()) == value,
                    None => false,
                },
                None => false,
            }
        };
        if found {
            if seen == nth {
                return Some(i + 1);
            }
            seen += 1;
        }
    }
    if value.is_empty() {
        return None;
    }
    source
        .lines()
        .position(|l| l.contains(value))
        .map(|i| i + 1)
}

/// A scalar without its quotes or trailing comment.
fn unquote(text: &str) -> String {
    let text = text.trim();
    for quote in ['"', '\''] {
        if let Some(inner) = text.strip_prefix(quote)
            && let Some(end) = inner.rfind(quote)
        {
            let inner = &inner[..end];
            return if quote == '"' {
                inner.replace("\\\\", "\\").replace("\\\"", "\"")
            } else {
                inner.replace("''", "'")
            };
        }
    }
    match text.find(" #") {
        Some(at) => text[..at].trim_end().to_string(),
        None => text.to_string(),
    }
}
