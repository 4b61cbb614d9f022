//! Judging one condition on a call's arguments: following its pointer to every value it
//! reaches (`*` included) and testing each, failing toward "cannot be judged" whenever a
//! value cannot be read the way the test needs.

use serde_json::Value;

use super::{
    Condition, Test,
    paths::{Resolved, under},
};

/// A condition's outcome.
pub(super) enum Held {
    Yes,
    No,
    /// Cannot be judged; why.
    Unknown(String),
}

/// Calls `f` with every value `segments` reach below `v` (`path`: the concrete pointer so far,
/// kept only when `want_paths`), or with why a branch cannot be followed: a scalar where the
/// pointer goes on (a server may decode a string holding JSON, as the Python SDK does for
/// non-`str` parameters: `strings_holding_json_every_element_symlinks_and_redaction_whatever_decides`).
/// A `None` segment (`*`) stands for every element or member.
fn reach<'v>(
    v: &'v Value,
    segments: &[Option<String>],
    path: &mut String,
    want_paths: bool,
    f: &mut dyn FnMut(&str, Result<&'v Value, String>),
) {
    let Some((segment, rest)) = segments.split_first() else {
        f(path, Ok(v));
        return;
    };
    let mut down = |key: &str, c: &'v Value, path: &mut String| {
        let len = path.len();
        if want_paths {
            path.push('/');
            path.push_str(&key.replace('~', "~0").replace('/', "~1"));
        }
        reach(c, rest, path, want_paths, f);
        path.truncate(len);
    };
    match (v, segment) {
        (Value::Object(map), None) => {
            for (k, c) in map {
                down(k, c, path);
            }
        }
        (Value::Array(items), None) => {
            for (i, c) in items.iter().enumerate() {
                down(&i.to_string(), c, path);
            }
        }
        (Value::Object(map), Some(key)) => {
            if let Some(c) = map.get(key) {
                down(key, c, path);
            }
        }
        (Value::Array(items), Some(key)) => {
            if let Some(c) = key.parse::<usize>().ok().and_then(|i| items.get(i)) {
                down(key, c, path);
            }
        }
        (Value::Null, _) => {}
        (scalar, _) => f(
            path,
            Err(format!(
                "{} is {} where the pointer goes on (a server may read it as JSON)",
                if path.is_empty() {
                    "a value"
                } else {
                    path.as_str()
                },
                kind(scalar)
            )),
        ),
    }
}

impl Condition {
    /// Whether the condition holds; `every`: for every value a `*` reaches (else for any).
    /// `reached` gets the concrete pointers of the values it looked at.
    pub(super) fn held(
        &self,
        arguments: &Value,
        every: bool,
        paths: &mut Resolved,
        reached: &mut Vec<String>,
        want_paths: bool,
    ) -> Held {
        let (mut found, mut yes, mut no, mut unknown) = (false, false, false, None::<String>);
        let mut path = String::new();
        let test = &self.test;
        reach(
            arguments,
            &self.segments,
            &mut path,
            want_paths,
            &mut |at, value| {
                let held = match value {
                    Err(why) => Held::Unknown(why),
                    Ok(v) => {
                        found = true;
                        if want_paths {
                            reached.push(at.to_owned());
                        }
                        match test {
                            Test::Present(_) => Held::Yes,
                            _ => self.test_value(&self.pointer, v, paths),
                        }
                    }
                };
                match held {
                    Held::Yes => yes = true,
                    Held::No => no = true,
                    Held::Unknown(why) => {
                        unknown.get_or_insert(why);
                    }
                }
            },
        );
        if let Test::Present(want) = self.test {
            return match unknown {
                Some(why) => Held::Unknown(why),
                None => yes_if(found == want),
            };
        }
        if !found && unknown.is_none() {
            return Held::No;
        }
        match (every, yes, no, unknown) {
            (true, _, true, _) => Held::No,
            (false, true, _, _) => Held::Yes,
            (_, _, _, Some(why)) => Held::Unknown(why),
            (true, _, false, None) => Held::Yes,
            (false, false, _, None) => Held::No,
        }
    }

    fn test_value(&self, p: &str, v: &Value, paths: &mut Resolved) -> Held {
        match &self.test {
            Test::Present(_) => Held::Yes,
            Test::Glob(_, m) => match v.as_str() {
                Some(s) => yes_if(m.is_match(s)),
                None => Held::Unknown(format!("{p} is {}, not a string", kind(v))),
            },
            Test::Regex(r) => match v.as_str() {
                Some(s) => yes_if(r.is_match(s)),
                None => Held::Unknown(format!("{p} is {}, not a string", kind(v))),
            },
            Test::PathPrefix(prefix) => match v.as_str() {
                Some(s) => match paths.both(s) {
                    // As written and as the host resolves it now (symlinks, `..` after one,
                    // `/proc/self/root`): both under the prefix or both not, else unknown.
                    (Some(path), real) => match (
                        under(path, prefix),
                        real.as_deref().map(|r| under(r, prefix)),
                    ) {
                        (true, Some(true)) => Held::Yes,
                        (false, Some(false)) => Held::No,
                        (lexical, None) => yes_if(lexical),
                        _ => Held::Unknown(format!(
                            "{p} {s:?} reads as one place and resolves through a symlink to another, one of them under {prefix}"
                        )),
                    },
                    (None, _) => Held::Unknown(format!(
                        "{p} {s:?} is not an absolute path, so whether it lies under {prefix} depends on the server's directory"
                    )),
                },
                None => Held::Unknown(format!("{p} is {}, not a path", kind(v))),
            },
            Test::Range(range) => match v.as_f64() {
                Some(n) => {
                    yes_if(range.min.is_none_or(|lo| n >= lo) && range.max.is_none_or(|hi| n <= hi))
                }
                None if v.is_number() => {
                    Held::Unknown(format!("{p} is {v}, past what a double holds"))
                }
                None => Held::Unknown(format!("{p} is {}, not a number", kind(v))),
            },
        }
    }
}

fn yes_if(b: bool) -> Held {
    if b { Held::Yes } else { Held::No }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
