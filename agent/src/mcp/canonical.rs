//! What the shim and the filter proxy send to an MCP server: their own serialisation of each
//! client message, never the bytes the client wrote.
//!
//! A server's parser and ours can disagree on the same bytes: the Python SDK's stdio server
//! reads lines with universal newlines and splits at a bare `\r` that a JSON parser takes for
//! whitespace (a `tools/call` hidden between two `\r` would run a denied tool). So every
//! client message is parsed here strictly (RFC 8259, UTF-8, no duplicate keys, bounded depth)
//! and written out again in one canonical form that every receiver reads the same way:
//!
//! - no whitespace at all, so no separator of any kind (`\r`, `\n`, U+2028, ...) is left
//!   outside strings;
//! - inside strings only `"`, `\`, the control characters and the characters some readers
//!   split lines at (U+007F, U+0085, U+2028, U+2029) and U+FEFF are escaped, as `\uXXXX` or
//!   the short escapes; everything else is written as UTF-8, so `"tools\u002fcall"` becomes
//!   `"tools/call"`, the spelling the filter judges;
//! - numbers are kept as written (validated), so an allowed call's arguments keep their exact
//!   values; key order is kept.
//!
//! What cannot be read this way (invalid UTF-8, a lone surrogate escape, a duplicate key, a
//! byte order mark, trailing bytes, nesting past [`MAX_DEPTH`]) is [`Malformed`]: the caller
//! answers with a JSON-RPC parse error and forwards nothing.

/// Deepest nesting of arrays and objects accepted: serde_json's own recursion limit, which the
/// filter's parse of the result must not hit.
pub(crate) const MAX_DEPTH: usize = 120;

/// Why a client message could not be read strictly; the byte offsets are into the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Malformed {
    #[error("not valid UTF-8 (byte {0})")]
    Utf8(usize),
    #[error("{what} at byte {at}")]
    Syntax { what: &'static str, at: usize },
    #[error("key {key} appears twice in one object (byte {at})")]
    DuplicateKey { key: String, at: usize },
    #[error("nested deeper than {MAX_DEPTH} arrays and objects (byte {0})")]
    TooDeep(usize),
    #[error("the key {NUMBER_KEY:?}, which toolwall's reader takes for a number, at byte {0}")]
    NumberKey(usize),
}

/// serde_json (with `arbitrary_precision`, which keeps numbers' text) reads an object whose
/// first key is this as the number its value spells; every other reader sees an object. So a
/// client message with it would be judged as one thing and run as another: it is refused.
const NUMBER_KEY: &str = "$serde_json::private::Number";

/// The canonical form of one JSON value (the whole of `input`, whitespace around it allowed);
/// `Ok(None)` when `input` is only whitespace.
pub(crate) fn canonical(input: &[u8]) -> Result<Option<Vec<u8>>, Malformed> {
    let text = std::str::from_utf8(input).map_err(|e| Malformed::Utf8(e.valid_up_to()))?;
    let mut w = Writer {
        text,
        bytes: input,
        pos: 0,
        out: Vec::with_capacity(input.len()),
    };
    w.skip_ws();
    if w.pos == input.len() {
        return Ok(None);
    }
    w.value(0)?;
    w.skip_ws();
    if w.pos != input.len() {
        return Err(w.syntax("bytes after the message"));
    }
    Ok(Some(w.out))
}

struct Writer<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    out: Vec<u8>,
}

impl Writer<'_> {
    fn syntax(&self, what: &'static str) -> Malformed {
        Malformed::Syntax { what, at: self.pos }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn expect(&mut self, byte: u8, what: &'static str) -> Result<(), Malformed> {
        if self.peek() == Some(byte) {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.syntax(what))
        }
    }

    fn value(&mut self, depth: usize) -> Result<(), Malformed> {
        match self.peek() {
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => self.string(),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(b't') => self.literal(b"true"),
            Some(b'f') => self.literal(b"false"),
            Some(b'n') => self.literal(b"null"),
            Some(_) => Err(self.syntax("not a JSON value")),
            None => Err(self.syntax("the message ends inside a value")),
        }
    }

    fn literal(&mut self, word: &'static [u8]) -> Result<(), Malformed> {
        if self.bytes[self.pos..].starts_with(word) {
            self.pos += word.len();
            self.out.extend_from_slice(word);
            Ok(())
        } else {
            Err(self.syntax("not a JSON value"))
        }
    }

    fn array(&mut self, depth: usize) -> Result<(), Malformed> {
        if depth > MAX_DEPTH {
            return Err(Malformed::TooDeep(self.pos));
        }
        self.pos += 1;
        self.out.push(b'[');
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            self.out.push(b']');
            return Ok(());
        }
        loop {
            self.skip_ws();
            self.value(depth)?;
            self.skip_ws();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.out.push(b',');
                }
                Some(b']') => {
                    self.pos += 1;
                    self.out.push(b']');
                    return Ok(());
                }
                _ => return Err(self.syntax("expected `,` or `]`")),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<(), Malformed> {
        if depth > MAX_DEPTH {
            return Err(Malformed::TooDeep(self.pos));
        }
        let open = self.pos;
        self.pos += 1;
        self.out.push(b'{');
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            self.out.push(b'}');
            return Ok(());
        }
        // Where each key's canonical text lies in `out`: the encoding is one-to-one, so two
        // spellings of one key (`"a"`, `"\u0061"`) are equal bytes there.
        let mut keys: Vec<(usize, usize)> = Vec::new();
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return Err(self.syntax("expected a key"));
            }
            let start = self.out.len();
            let at = self.pos;
            self.string()?;
            if self.out[start..]
                .strip_prefix(b"\"")
                .and_then(|k| k.strip_suffix(b"\""))
                == Some(NUMBER_KEY.as_bytes())
            {
                return Err(Malformed::NumberKey(at));
            }
            keys.push((start, self.out.len()));
            self.skip_ws();
            self.expect(b':', "expected `:`")?;
            self.out.push(b':');
            self.skip_ws();
            self.value(depth)?;
            self.skip_ws();
            match self.peek() {
                Some(b',') => {
                    self.pos += 1;
                    self.out.push(b',');
                }
                Some(b'}') => {
                    self.pos += 1;
                    self.out.push(b'}');
                    return self.unique(&mut keys, open);
                }
                _ => return Err(self.syntax("expected `,` or `}`")),
            }
        }
    }

    /// Refuses an object with a key twice: receivers disagree on which one counts (most keep
    /// the last, serde's derive refuses), so the message means different things to each.
    fn unique(&self, keys: &mut [(usize, usize)], open: usize) -> Result<(), Malformed> {
        let text = |&(a, b): &(usize, usize)| &self.out[a..b];
        keys.sort_unstable_by(|x, y| text(x).cmp(text(y)));
        match keys.windows(2).find(|w| text(&w[0]) == text(&w[1])) {
            Some(w) => Err(Malformed::DuplicateKey {
                key: String::from_utf8_lossy(text(&w[0])).into_owned(),
                at: open,
            }),
            None => Ok(()),
        }
    }

    fn number(&mut self) -> Result<(), Malformed> {
        let start = self.pos;
        let digits = |w: &mut Self| {
            let from = w.pos;
            while matches!(w.peek(), Some(b'0'..=b'9')) {
                w.pos += 1;
            }
            w.pos > from
        };
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                digits(self);
            }
            _ => return Err(self.syntax("a number without digits")),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if !digits(self) {
                return Err(self.syntax("a number without digits after `.`"));
            }
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.pos += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.pos += 1;
            }
            if !digits(self) {
                return Err(self.syntax("a number without digits in its exponent"));
            }
        }
        self.out.extend_from_slice(&self.bytes[start..self.pos]);
        Ok(())
    }

    fn string(&mut self) -> Result<(), Malformed> {
        self.pos += 1;
        self.out.push(b'"');
        loop {
            // Copy the run of bytes that need nothing done in one go.
            let run = self.bytes[self.pos..]
                .iter()
                .position(|&b| b < 0x20 || b == b'"' || b == b'\\' || b >= 0x7f)
                .unwrap_or(self.bytes.len() - self.pos);
            self.out
                .extend_from_slice(&self.bytes[self.pos..self.pos + run]);
            self.pos += run;
            match self.peek() {
                None => return Err(self.syntax("the message ends inside a string")),
                Some(b'"') => {
                    self.pos += 1;
                    self.out.push(b'"');
                    return Ok(());
                }
                Some(b'\\') => {
                    let c = self.escape()?;
                    push_char(&mut self.out, c);
                }
                Some(b) if b < 0x20 => {
                    return Err(self.syntax("a control character inside a string"));
                }
                Some(_) => {
                    // Valid UTF-8 (checked up front), so a char starts here.
                    let c = self.text[self.pos..]
                        .chars()
                        .next()
                        .ok_or_else(|| self.syntax("the message ends inside a string"))?;
                    self.pos += c.len_utf8();
                    push_char(&mut self.out, c);
                }
            }
        }
    }

    /// The character a backslash escape stands for; `self.pos` is at the backslash.
    fn escape(&mut self) -> Result<char, Malformed> {
        let at = self.pos;
        let kind = self.bytes.get(at + 1).copied();
        self.pos += 2;
        Ok(match kind {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\u{8}',
            Some(b'f') => '\u{c}',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                let high = self.hex4(at)?;
                let code = match high {
                    0xD800..=0xDBFF => {
                        if self.bytes.get(self.pos..self.pos + 2) != Some(b"\\u") {
                            return Err(Malformed::Syntax {
                                what: "a lone surrogate escape",
                                at,
                            });
                        }
                        self.pos += 2;
                        let low = self.hex4(at)?;
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return Err(Malformed::Syntax {
                                what: "a lone surrogate escape",
                                at,
                            });
                        }
                        0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
                    }
                    0xDC00..=0xDFFF => {
                        return Err(Malformed::Syntax {
                            what: "a lone surrogate escape",
                            at,
                        });
                    }
                    code => code,
                };
                char::from_u32(code).ok_or(Malformed::Syntax {
                    what: "an escape that is not a character",
                    at,
                })?
            }
            _ => {
                return Err(Malformed::Syntax {
                    what: "an unknown escape",
                    at,
                });
            }
        })
    }

    fn hex4(&mut self, at: usize) -> Result<u32, Malformed> {
        let digits = self
            .bytes
            .get(self.pos..self.pos + 4)
            .and_then(|d| std::str::from_utf8(d).ok())
            .filter(|d| d.bytes().all(|b| b.is_ascii_hexdigit()))
            .and_then(|d| u32::from_str_radix(d, 16).ok())
            .ok_or(Malformed::Syntax {
                what: "a `\\u` escape without four hex digits",
                at,
            })?;
        self.pos += 4;
        Ok(digits)
    }
}

/// Writes one character of a string in canonical form.
fn push_char(out: &mut Vec<u8>, c: char) {
    let short: &[u8] = match c {
        '"' => b"\\\"",
        '\\' => b"\\\\",
        '\n' => b"\\n",
        '\r' => b"\\r",
        '\t' => b"\\t",
        '\u{8}' => b"\\b",
        '\u{c}' => b"\\f",
        c if (c as u32) < 0x20
            || matches!(
                c,
                '\u{7f}' | '\u{85}' | '\u{2028}' | '\u{2029}' | '\u{feff}'
            ) =>
        {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            let n = c as u32;
            out.extend_from_slice(b"\\u");
            for shift in [12, 8, 4, 0] {
                out.push(HEX[((n >> shift) & 0xf) as usize]);
            }
            return;
        }
        c => {
            let mut buf = [0u8; 4];
            out.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            return;
        }
    };
    out.extend_from_slice(short);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(s: &[u8]) -> Result<String, Malformed> {
        canonical(s).map(|o| String::from_utf8(o.unwrap_or_default()).unwrap())
    }

    #[test]
    fn whitespace_goes_escapes_are_undone_numbers_and_order_stay() {
        assert_eq!(
            canon(b" {\r\"method\" :\t\"tools\\u002fcall\", \"params\":{\"b\":1.50e+3,\"a\":[ -0, 12345678901234567890123 ]}}\r\n").unwrap(),
            r#"{"method":"tools/call","params":{"b":1.50e+3,"a":[-0,12345678901234567890123]}}"#
        );
        assert_eq!(canon(b" \r\n\t").unwrap(), "");
    }

    #[test]
    fn line_breaks_of_every_reader_are_escaped() {
        let input = "[\"a\\r\\n\\u2028\u{2028}\u{2029}\u{85}\u{7f}\u{feff}\\u0000\\u001f\\/\u{e9}\u{1F600}\\ud83d\\ude00\"]";
        let out = canon(input.as_bytes()).unwrap();
        assert_eq!(
            out,
            "[\"a\\r\\n\\u2028\\u2028\\u2029\\u0085\\u007f\\ufeff\\u0000\\u001f/\u{e9}\u{1F600}\u{1F600}\"]"
        );
        assert!(out.bytes().all(|b| b >= 0x20), "{out:?}");
        // The canonical form is its own canonical form.
        assert_eq!(canon(out.as_bytes()).unwrap(), out);
        // And means the same to a standard parser.
        let a: serde_json::Value = serde_json::from_str(input).unwrap();
        let b: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(a, b);
    }

    #[test]
    fn what_receivers_could_read_differently_is_refused() {
        for bad in [
            &b"{\"a\":1}\r{\"b\":2}"[..],
            b"{\"a\":1} x",
            b"{\"method\":\"ping\",\"method\":\"tools/call\"}",
            b"{\"a\":1,\"\\u0061\":2}",
            b"\xef\xbb\xbf{}",
            b"{\"a\":\"\xff\"}",
            b"{\"a\":\"\xc0\xaf\"}",
            b"[\"\\ud800\"]",
            b"[\"\\udc00\\ud800\"]",
            b"[\"\\ud800\\u0041\"]",
            b"[\"a\nb\"]",
            b"[\"\\x41\"]",
            b"[\"\\u12\"]",
            b"[NaN]",
            b"[Infinity]",
            b"[01]",
            b"[1.]",
            b"[.5]",
            b"[1e]",
            b"[+1]",
            b"[1,]",
            b"{\"a\":1,}",
            b"{a:1}",
            b"['a']",
            b"[tru]",
            b"{\"a\" 1}",
            b"\"unterminated",
            b"[",
            b"\x00{}",
            // serde_json reads these as the number 1; a server, as an object.
            b"{\"a\":{\"$serde_json::private::Number\":\"1\"}}",
            b"[{\"\\u0024serde_json::private::Number\":\"1\"}]",
            b"{\"x\":0,\"$serde_json::private::Number\":\"1\"}",
        ] {
            assert!(
                canonical(bad).is_err(),
                "accepted {:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn depth_is_bounded() {
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(canonical(ok.as_bytes()).is_ok());
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert!(matches!(
            canonical(deep.as_bytes()),
            Err(Malformed::TooDeep(_))
        ));
        let objects = format!(
            "{}1{}",
            "{\"a\":".repeat(MAX_DEPTH + 1),
            "}".repeat(MAX_DEPTH + 1)
        );
        assert!(matches!(
            canonical(objects.as_bytes()),
            Err(Malformed::TooDeep(_))
        ));
    }

    #[test]
    fn many_keys_are_checked_for_duplicates_without_quadratic_cost() {
        let mut obj: String = (0..50_000).map(|i| format!("\"k{i}\":{i},")).collect();
        obj.insert(0, '{');
        obj.push_str("\"k49999\":0}");
        assert!(matches!(
            canonical(obj.as_bytes()),
            Err(Malformed::DuplicateKey { .. })
        ));
    }

    /// Whatever serde_json reads as one value, the canonical form reads as the same value (the
    /// oracle is a second, independent parser).
    #[test]
    fn agrees_with_serde_json_on_random_values() {
        let mut seed = 0x2545F4914F6CDD1Du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let atoms = [
            "1",
            "-0.5e-3",
            "\"x\\u00e9\\n\"",
            "\"\u{2028}\"",
            "null",
            "true",
            "[]",
            "{}",
            "\"\\\\\"",
            "1E+2",
        ];
        for _ in 0..2_000 {
            let mut s = String::new();
            let n = next() % 6;
            s.push('[');
            for i in 0..n {
                if i > 0 {
                    s.push_str(if next() % 2 == 0 { "," } else { " ,\r\n" });
                }
                let atom = atoms[(next() % atoms.len() as u64) as usize];
                if next() % 3 == 0 {
                    s.push_str(&format!("{{\"k{i}\" : {atom}}}"));
                } else {
                    s.push_str(atom);
                }
            }
            s.push(']');
            let ours = canon(s.as_bytes()).unwrap();
            let a: serde_json::Value = serde_json::from_str(&s).unwrap();
            let b: serde_json::Value = serde_json::from_str(&ours).unwrap();
            assert_eq!(a, b, "{s:?} -> {ours:?}");
        }
    }
}
