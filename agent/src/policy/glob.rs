//! Globs for server and tool names: `*` (any run of characters, `/` included) and `?` (one
//! character), matched case-insensitively, everything else literal.
//!
//! Tool names are short, so a compiled pattern (lowercased characters) and the classic
//! two-pointer matcher with one backtrack point are enough: linear in practice, worst case
//! O(pattern × name), no allocation per match.

/// A compiled glob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Glob {
    source: String,
    pattern: Vec<Token>,
    literals: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Token {
    Star,
    Any,
    Char(char),
}

impl Glob {
    /// Compiles `source`.
    pub(crate) fn new(source: &str) -> Glob {
        let mut pattern = Vec::with_capacity(source.len());
        for c in source.chars() {
            let token = match c {
                '*' => Token::Star,
                '?' => Token::Any,
                c => Token::Char(fold(c)),
            };
            // `**` means the same as `*`; collapsing keeps the backtracking simple.
            if token == Token::Star && pattern.last() == Some(&Token::Star) {
                continue;
            }
            pattern.push(token);
        }
        let literals = pattern
            .iter()
            .filter(|t| matches!(t, Token::Char(_)))
            .count();
        Glob {
            source: source.to_string(),
            pattern,
            literals,
        }
    }

    /// The pattern as written.
    pub(crate) fn as_str(&self) -> &str {
        &self.source
    }

    /// How many literal characters it has: a rough measure of how specific it is (rules with
    /// more literals win over broader ones).
    pub(crate) fn literals(&self) -> usize {
        self.literals
    }

    /// Whether `text` matches, ignoring case.
    pub(crate) fn matches(&self, text: &str) -> bool {
        let pattern = &self.pattern;
        let mut p = 0;
        let mut t = 0;
        // Where to resume after the last `*`: (pattern index after it, text byte offset).
        let mut resume: Option<(usize, usize)> = None;
        while t < text.len() {
            let c = next_char(text, t);
            match pattern.get(p) {
                Some(Token::Star) => {
                    p += 1;
                    resume = Some((p, t));
                    continue;
                }
                Some(Token::Any) => {
                    p += 1;
                    t += c.len_utf8();
                    continue;
                }
                Some(Token::Char(want)) if *want == fold(c) => {
                    p += 1;
                    t += c.len_utf8();
                    continue;
                }
                _ => {}
            }
            // Mismatch: let the last `*` swallow one more character, or fail.
            match resume {
                Some((after_star, from)) => {
                    let skipped = next_char(text, from).len_utf8();
                    p = after_star;
                    t = from + skipped;
                    resume = Some((after_star, t));
                }
                None => return false,
            }
        }
        pattern[p..].iter().all(|t| *t == Token::Star)
    }
}

fn next_char(text: &str, at: usize) -> char {
    text[at..].chars().next().unwrap_or('\0')
}

/// Case folding for matching: ASCII fast, other characters by their first lowercase form.
fn fold(c: char) -> char {
    if c.is_ascii() {
        c.to_ascii_lowercase()
    } else {
        c.to_lowercase().next().unwrap_or(c)
    }
}

#[cfg(test)]
mod tests {
    use super::Glob;

    #[test]
    fn table() {
        let cases = [
            ("*", "", true),
            ("*", "anything/at/all", true),
            ("delete_*", "delete_file", true),
            ("delete_*", "DELETE_FILE", true),
            ("delete_*", "undelete_file", false),
            ("*_file", "read_file", true),
            ("*_file", "read_files", false),
            ("read?file", "read_file", true),
            ("read?file", "readfile", false),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("a*b", "a/b", true),
            ("fs/*", "fs/read/deep", true),
            ("*exec*", "remote_EXECute", true),
            ("get-sum", "get-sum", true),
            ("get-sum", "get_sum", false),
            ("ÄPFEL*", "äpfelkuchen", true),
            ("?", "é", true),
            ("??", "é", false),
            ("a**b", "ab", true),
            ("", "", true),
            ("", "x", false),
        ];
        for (pattern, text, want) in cases {
            assert_eq!(
                Glob::new(pattern).matches(text),
                want,
                "{pattern:?} vs {text:?}"
            );
        }
    }

    #[test]
    fn specificity() {
        assert_eq!(Glob::new("*").literals(), 0);
        assert_eq!(Glob::new("delete_*").literals(), 7);
        assert_eq!(Glob::new("a?c").literals(), 2);
    }
}
