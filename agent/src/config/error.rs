//! Configuration errors: each names the file, the line when it is known, the key, and what to
//! do about it, because the reader is a person fixing a file before toolwall will start.

use std::{fmt, path::PathBuf};

/// Where in a file something is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Location {
    /// The file (or `<embedded default>`, or the CLI flag a value came from).
    pub file: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// 1-based column, when known.
    pub column: Option<usize>,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
            if let Some(column) = self.column {
                write!(f, ":{column}")?;
            }
        }
        Ok(())
    }
}

/// Why a configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read the configuration file: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Not valid YAML, an unknown key, a wrong type or an unknown enum value.
    #[error("{location}: {message}\n  hint: {hint}")]
    Syntax {
        /// Where.
        location: Location,
        /// The parser's message (it names the key path and the offending key or value).
        message: String,
        /// What to do.
        hint: &'static str,
    },
    /// Valid YAML that makes no sense as a policy (missing or conflicting fields, bad regex…).
    #[error("{location}: {key}: {message}\n  hint: {hint}")]
    Invalid {
        /// Where.
        location: Location,
        /// The key path, e.g. `sandbox.mcp.servers[2].url`.
        key: String,
        /// What is wrong.
        message: String,
        /// What to do.
        hint: &'static str,
    },
}

impl ConfigError {
    /// Turns a YAML parser error into one that leads with `file:line:column`.
    pub(crate) fn from_yaml(file: &str, error: &serde_yaml_ng::Error) -> Self {
        let mut message = error.to_string();
        let (line, column) = match error.location() {
            Some(loc) => {
                // The parser appends " at line L column C"; the location leads instead.
                let suffix = format!(" at line {} column {}", loc.line(), loc.column());
                if let Some(stripped) = message.strip_suffix(&suffix) {
                    message = stripped.to_string();
                }
                (Some(loc.line()), Some(loc.column()))
            }
            None => (None, None),
        };
        let hint = if message.contains("unknown field") {
            "misspelt or misplaced key; `toolwall config default` prints every valid key in place"
        } else if message.contains("unknown variant") {
            "use one of the values listed above"
        } else if message.contains("missing field") {
            "add the key named above"
        } else {
            "fix the YAML at that position; `toolwall config default` prints a valid file"
        };
        ConfigError::Syntax {
            location: Location {
                file: file.to_string(),
                line,
                column,
            },
            message,
            hint,
        }
    }
}
