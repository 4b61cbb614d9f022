//! Characters a person reading text does not see, or that change how the text around them
//! reads: controls (escapes, bells, line ends), every format character (zero-width, soft
//! hyphen, bidirectional marks, embeddings and isolates, invisible operators, tags), line and
//! paragraph separators, fillers and variation selectors, every default-ignorable code point, and
//! spaces other than the ASCII one (a no-break space after a name hides in a table). One set for every view: the CLI's
//! tables and answers (`views::printable`), the approval webhook's text, the web view (which
//! gets [`RANGES`] embedded in its page, `daemon/web.rs`), and the definition checks, which
//! flag such characters in what a server says to the model (`policy/definitions.rs`). A name
//! shown as `read_file` is then never `read\u{2060}_file`.

use std::borrow::Cow;

/// The set, as inclusive code point ranges, sorted and apart; every `Cc` and `Cf` character
/// is in it (`ranges_are_sorted_apart_and_cover_every_control_and_format_character`).
pub(crate) const RANGES: &[(u32, u32)] = &[
    // C0 controls.
    (0x0000, 0x001F),
    // DEL and the C1 controls; no-break space (`read_file\u{a0}` reads as `read_file`).
    (0x007F, 0x00A0),
    // Soft hyphen.
    (0x00AD, 0x00AD),
    // Combining grapheme joiner.
    (0x034F, 0x034F),
    // Arabic number signs, letter mark, end of ayah; Syriac abbreviation mark; Arabic pound
    // and piastre marks above, disputed end of ayah.
    (0x0600, 0x0605),
    (0x061C, 0x061C),
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    // Hangul choseong and jungseong fillers.
    (0x115F, 0x1160),
    // Ogham space mark.
    (0x1680, 0x1680),
    // Khmer inherent vowels (shown as nothing).
    (0x17B4, 0x17B5),
    // Mongolian free variation selectors and vowel separator.
    (0x180B, 0x180F),
    // Spaces of every width but the ASCII one; zero-width space, non-joiner, joiner;
    // left-to-right and right-to-left marks.
    (0x2000, 0x200F),
    // Line and paragraph separators; bidirectional embeddings and overrides; narrow no-break
    // space.
    (0x2028, 0x202F),
    // Medium mathematical space; word joiner, invisible operators, bidirectional isolates,
    // deprecated format characters.
    (0x205F, 0x206F),
    // Braille pattern blank (drawn as nothing).
    (0x2800, 0x2800),
    // Ideographic space.
    (0x3000, 0x3000),
    // Hangul filler.
    (0x3164, 0x3164),
    // Variation selectors.
    (0xFE00, 0xFE0F),
    // Zero-width no-break space (byte order mark).
    (0xFEFF, 0xFEFF),
    // Halfwidth Hangul filler.
    (0xFFA0, 0xFFA0),
    // Unassigned default-ignorable code points; interlinear annotation anchors.
    (0xFFF0, 0xFFFB),
    // Kaithi number signs.
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    // Egyptian hieroglyph format controls.
    (0x13430, 0x1343F),
    // Shorthand format controls.
    (0x1BCA0, 0x1BCA3),
    // Musical symbol beams and ties.
    (0x1D173, 0x1D17A),
    // Tags, variation selectors supplement, and the rest of the default-ignorable plane block.
    (0xE0000, 0xE0FFF),
];

/// Whether `c` is in the set ([`RANGES`]).
pub(crate) fn is_hidden(c: char) -> bool {
    let c = u32::from(c);
    // Printable ASCII, most of any text, is in no range (`RANGES` starts with the C0 controls
    // and goes on at DEL): every character of a 14 MB listing is asked.
    if (0x20..0x7F).contains(&c) {
        return false;
    }
    RANGES
        .binary_search_by(|&(start, end)| {
            if end < c {
                std::cmp::Ordering::Less
            } else if start > c {
                std::cmp::Ordering::Greater
            } else {
                std::cmp::Ordering::Equal
            }
        })
        .is_ok()
}

/// `text` with each hidden character written as `\u{..}` (the web view writes the same).
pub(crate) fn escaped(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_hidden) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match is_hidden(c) {
            true => out.extend(c.escape_unicode()),
            false => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The printable ASCII shortcut of [`is_hidden`] answers what the ranges answer.
    #[test]
    fn printable_ascii_is_in_no_range() {
        for c in 0x20..0x7F_u32 {
            assert!(
                !RANGES
                    .iter()
                    .any(|&(start, end)| (start..=end).contains(&c)),
                "U+{c:04X}"
            );
        }
    }

    #[test]
    fn ranges_are_sorted_apart_and_cover_every_control_and_format_character() {
        for pair in RANGES.windows(2) {
            assert!(
                pair[0].0 <= pair[0].1 && pair[0].1 + 1 < pair[1].0,
                "{pair:?}"
            );
        }
        // The regex crate's Unicode tables name the categories: a character a later Unicode
        // adds to them fails here until it is added above.
        let categories = regex::Regex::new(r"^[\p{Cc}\p{Cf}]$").expect("valid");
        let missing: Vec<String> = (0..=0x10FFFF)
            .filter_map(char::from_u32)
            .filter(|&c| categories.is_match(c.encode_utf8(&mut [0; 4])) && !is_hidden(c))
            .map(|c| format!("U+{:04X}", u32::from(c)))
            .collect();
        assert!(missing.is_empty(), "not in RANGES: {missing:?}");
    }

    #[test]
    fn hidden_characters_are_escaped_and_the_rest_is_kept() {
        for c in [
            '\u{0}',
            '\u{1B}',
            '\n',
            '\u{7F}',
            '\u{9B}',
            '\u{AD}',
            '\u{34F}',
            '\u{61C}',
            '\u{115F}',
            '\u{1160}',
            '\u{180B}',
            '\u{180E}',
            '\u{180F}',
            '\u{200B}',
            '\u{200F}',
            '\u{2028}',
            '\u{2029}',
            '\u{202A}',
            '\u{202E}',
            '\u{2060}',
            '\u{2065}',
            '\u{2066}',
            '\u{206F}',
            '\u{3164}',
            '\u{FE00}',
            '\u{FE0F}',
            '\u{FEFF}',
            '\u{FFA0}',
            '\u{FFF9}',
            '\u{FFFB}',
            '\u{1D173}',
            '\u{1D17A}',
            '\u{E0000}',
            '\u{E0001}',
            '\u{E0041}',
            '\u{E007F}',
            '\u{E0100}',
            '\u{E01EF}',
            '\u{A0}',
            '\u{1680}',
            '\u{2000}',
            '\u{200A}',
            '\u{202F}',
            '\u{205F}',
            '\u{2800}',
            '\u{3000}',
            '\u{FFF0}',
            '\u{E0080}',
            '\u{E0FFF}',
        ] {
            assert!(is_hidden(c), "U+{:04X}", u32::from(c));
            let shown = escaped(&format!("read{c}_file")).into_owned();
            assert_eq!(shown, format!("read\\u{{{:x}}}_file", u32::from(c)));
        }
        for c in [
            'a',
            ' ',
            'é',
            '\u{2010}',
            '\u{2070}',
            '\u{FE10}',
            '😀',
            '\u{2801}',
            '\u{E1000}',
        ] {
            assert!(!is_hidden(c), "U+{:04X}", u32::from(c));
        }
        assert!(matches!(
            escaped("plain échoué"),
            Cow::Borrowed("plain échoué")
        ));
    }
}
