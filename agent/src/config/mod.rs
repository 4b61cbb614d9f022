//! The YAML configuration: schema, embedded default, loading and validation.
//!
//! One file configures every layer. The policy section keeps the seed's `sandbox.mcp` layout
//! so an existing file carries over; toolwall adds `deny:` (regexes on tool names) and
//! `name_patterns:` under it, and the top-level `proxy:`, `store:`, `netmon:`, `api:`,
//! `correlator:` and `interceptor:` sections. Unknown keys are errors (a typo in a deny rule
//! must not disable it), and every error names the file, the line and the key.

#![warn(missing_docs)]

mod arguments;
pub(crate) mod bundle;
mod deny_regex;
mod describe;
mod error;
mod pass_through;
mod paths;
mod servers;
mod types;
mod validate;

use std::path::Path;

pub(crate) use arguments::{ArgumentTest, compile_condition, normalized_path};
pub(crate) use deny_regex::{DENY_REGEX_DFA_SIZE_LIMIT, DENY_REGEX_SIZE_LIMIT, compile_deny_regex};
pub(crate) use describe::{describe, describe_policy};
pub(crate) use error::{ConfigError, Location};
pub(crate) use pass_through::{PassThrough, PassThroughEntry, Provider};
pub(crate) use paths::{default_store_path, prepare_socket_dir, socket_path};
pub(crate) use servers::*;
pub(crate) use types::*;

/// The embedded default configuration, as YAML (`toolwall config default` prints it).
pub(crate) const DEFAULT_YAML: &str = include_str!("default.yaml");

/// Largest configuration accepted: far above any real policy, far below what makes the YAML
/// parser slow.
pub(crate) const MAX_CONFIG_BYTES: usize = 1024 * 1024;
/// Deepest nesting accepted, of flow collections (`[`, `{`) and of indentation (in columns).
/// The YAML parser's cost grows with the square of the depth (a 200 KB file of nested `[` took
/// 44 s of CPU); no toolwall key is nested more than a few levels.
pub(crate) const MAX_FLOW_DEPTH: usize = 32;
pub(crate) const MAX_INDENT: usize = 128;

/// Most YAML aliases (`*name`) accepted. The parser expands each alias in full: 5,000 aliases of
/// one 200 KB anchored string took `config check` to a 1 GB peak. A policy needs few, if any.
pub(crate) const MAX_ALIASES: usize = 64;
/// Most text the aliases may expand to, taking each as big as the whole file.
const MAX_ALIAS_EXPANSION: usize = 16 * 1024 * 1024;
/// Backstop: most `*` at a token start anywhere — quoted, commented or in a block scalar too —
/// times the file's size. The exact count reads quotes and comments as YAML does on one line;
/// a text it misreads (a plain scalar continued on a line that starts with a quote) still
/// cannot hide enough aliases from this count to expand past it.
const MAX_STAR_EXPANSION: usize = 64 * 1024 * 1024;

/// Where an alias past the limits is, and which limit (the message).
#[derive(Debug, PartialEq)]
struct TooManyAliases {
    line: usize,
    column: usize,
    message: String,
}

/// Counts the aliases of `text`: a `*` at a token start outside quoted scalars, comments and
/// block scalars (a plain scalar cannot start with `*`, so there it is always an alias; a glob
/// is quoted, `"*"`). Refuses past [`MAX_ALIASES`] or [`MAX_ALIAS_EXPANSION`], naming the first
/// alias past the limit.
fn check_aliases(text: &str) -> Result<(), TooManyAliases> {
    let size = text.len().max(1);
    let most = MAX_ALIASES.min(MAX_ALIAS_EXPANSION / size);
    let most_stars = MAX_STAR_EXPANSION / size;
    let (mut aliases, mut stars) = (0usize, 0usize);
    // The indentation a block scalar's lines are deeper than, while in one.
    let mut block: Option<usize> = None;
    for (n, line) in text.lines().enumerate() {
        let indent = line.len() - line.trim_start_matches([' ', '\t']).len();
        let blank = line.trim().is_empty();
        let in_block = match block {
            Some(parent) if blank || indent > parent => true,
            _ => {
                block = None;
                false
            }
        };
        let mut quote: Option<char> = None;
        let mut escaped = false;
        let mut previous: Option<char> = None;
        let mut comment = in_block;
        // Where this line's last token started, outside quotes and comments (a block scalar
        // header `|`, `>-` is the last token of its line).
        let mut last_token = None;
        for (col, c) in line.char_indices() {
            let after_space = previous.is_none_or(char::is_whitespace);
            let token_start = after_space || matches!(previous, Some('[' | '{' | ','));
            previous = Some(c);
            if c == '*' && token_start {
                stars += 1;
                if stars > most_stars {
                    return Err(TooManyAliases {
                        line: n + 1,
                        column: col + 1,
                        message: format!(
                            "more than {most_stars} `*` starting a word in a file of {size} bytes (each may be an alias, expanded in full)"
                        ),
                    });
                }
            }
            if comment {
                continue;
            }
            match quote {
                Some('"') if escaped => escaped = false,
                Some('"') if c == '\\' => escaped = true,
                Some(q) if c == q => quote = None,
                Some(_) => {}
                None if token_start && matches!(c, '"' | '\'') => {
                    quote = Some(c);
                    last_token = None;
                }
                None if c == '#' && after_space => comment = true,
                None if c == '*'
                    && (token_start
                        || line[..col].ends_with("\":")
                        || line[..col].ends_with("':")) =>
                {
                    // `{"a":*x}`: after a quoted key's `:` too (there `:` needs no space).
                    aliases += 1;
                    if aliases > most {
                        return Err(TooManyAliases {
                            line: n + 1,
                            column: col + 1,
                            message: format!(
                                "more than {most} YAML aliases (`*name`) in a file of {size} bytes; each is expanded in full"
                            ),
                        });
                    }
                }
                None if token_start && !c.is_whitespace() => last_token = Some(col),
                None => {}
            }
        }
        if !in_block
            && quote.is_none()
            && let Some(at) = last_token
        {
            let token = line[at..].split_whitespace().next().unwrap_or_default();
            let header = token.strip_prefix(['|', '>']).is_some_and(|rest| {
                rest.chars()
                    .all(|c| c.is_ascii_digit() || c == '+' || c == '-')
            });
            if header {
                // Its lines are deeper than the line's key (`- key: |`), or than the line's own
                // indentation when the scalar is the entry itself (`- |`).
                let key = line.trim_start_matches([' ', '\t', '-', '?']);
                let key_col = line.len() - key.len();
                block = Some(if key_col == at { indent } else { key_col });
            }
        }
    }
    Ok(())
}

/// Refuses, before parsing, a file too large or nested too deep, naming the line.
fn check_bounds(text: &str, origin: &str) -> Result<(), ConfigError> {
    let refuse = |line: Option<usize>, column: Option<usize>, message: String| {
        Err(ConfigError::Syntax {
            location: error::Location {
                file: origin.to_string(),
                line,
                column,
            },
            message,
            hint: "a toolwall configuration is small and shallow; `toolwall config default` prints a valid file",
        })
    };
    if text.len() > MAX_CONFIG_BYTES {
        return refuse(
            None,
            None,
            format!(
                "the file is {} bytes, over the limit of {MAX_CONFIG_BYTES}",
                text.len()
            ),
        );
    }
    if let Err(too_many) = check_aliases(text) {
        return Err(ConfigError::Syntax {
            location: error::Location {
                file: origin.to_string(),
                line: Some(too_many.line),
                column: Some(too_many.column),
            },
            message: too_many.message,
            hint: "write the value out where it is needed instead of an alias, or quote a `*` that is text (`\"*\"`); at most 64 aliases",
        });
    }
    let mut depth = 0usize;
    for (n, line) in text.lines().enumerate() {
        let indent = line.len() - line.trim_start_matches([' ', '\t']).len();
        if indent > MAX_INDENT && !line.trim().is_empty() {
            return refuse(
                Some(n + 1),
                Some(indent + 1),
                format!("indented {indent} columns, deeper than the limit of {MAX_INDENT}"),
            );
        }
        // Flow nesting outside quoted scalars and comments. (A block scalar holding brackets
        // may count too high; no toolwall key takes one.)
        let mut quote = None;
        for (col, c) in line.char_indices() {
            match (quote, c) {
                (Some(q), c) if c == q => quote = None,
                (Some(_), _) => {}
                (None, '"' | '\'') => quote = Some(c),
                (None, '#') if col == 0 || line[..col].ends_with([' ', '\t']) => break,
                (None, '[' | '{') => {
                    depth += 1;
                    if depth > MAX_FLOW_DEPTH {
                        return refuse(
                            Some(n + 1),
                            Some(col + 1),
                            format!("brackets nested deeper than the limit of {MAX_FLOW_DEPTH}"),
                        );
                    }
                }
                (None, ']' | '}') => depth = depth.saturating_sub(1),
                _ => {}
            }
        }
    }
    Ok(())
}

/// How the embedded default is named in errors and in [`Config::origin`].
pub(crate) const EMBEDDED_ORIGIN: &str = "<embedded default>";

impl Config {
    /// Reads and validates a configuration file, or the embedded default when `path` is `None`.
    pub(crate) fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        match path {
            None => Config::parse(DEFAULT_YAML, EMBEDDED_ORIGIN),
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                })?;
                Config::parse(&text, &path.display().to_string())
            }
        }
    }

    /// Parses and validates YAML text; `origin` names it in errors (usually the file path).
    pub(crate) fn parse(text: &str, origin: &str) -> Result<Config, ConfigError> {
        check_bounds(text, origin)?;
        // An empty file (or only comments) is the default configuration, not an error.
        let mut config = if text.lines().all(|l| {
            let l = l.trim();
            l.is_empty() || l.starts_with('#') || l == "---"
        }) {
            Config::default()
        } else {
            serde_yaml_ng::from_str::<Config>(text)
                .map_err(|e| ConfigError::from_yaml(origin, &e))?
        };
        validate::validate(&mut config, origin, text)?;
        config.origin = origin.to_string();
        Ok(config)
    }

    /// The database path: `store.path`, or the per-user / system default.
    pub(crate) fn store_path(&self) -> std::path::PathBuf {
        default_store_path(self.store.path.as_deref())
    }

    /// Whether direct connections from the session to `server` must be denied (it is to be
    /// reached through `toolwall mcp-proxy`): its `via_proxy`, else `netmon.deny_direct`.
    pub(crate) fn must_use_proxy(&self, server: &ServerDecl) -> bool {
        server.server_type != ServerType::Stdio
            && server.via_proxy.unwrap_or(self.netmon.deny_direct)
    }
}

#[cfg(test)]
mod tests;
