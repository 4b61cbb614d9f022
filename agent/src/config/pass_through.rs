//! `proxy.pass_through`: the provider routes a host owner accepts uninspected, each a method
//! and a path pattern (`llm/routes.rs` relays them as they come and records each request).

use hyper::Method;
use serde::{Deserialize, Serialize};

/// A configured upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// `proxy.providers.anthropic`.
    Anthropic,
    /// `proxy.providers.openai`.
    Openai,
    /// `proxy.providers.gemini`.
    Gemini,
}

impl Provider {
    /// The name used in the configuration and in events.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Anthropic => "anthropic",
            Provider::Openai => "openai",
            Provider::Gemini => "gemini",
        }
    }
}

/// `method path` of a `proxy.pass_through` entry: `*` for any method; in the path, `*` is one
/// segment and a last `**` any rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassThrough {
    provider: Provider,
    method: Option<Method>,
    segments: Vec<String>,
    text: String,
}

/// A `proxy.pass_through` route that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadPassThrough(String);

impl PassThrough {
    /// Parses `METHOD /path` (e.g. `GET /v1/files/*/content`).
    pub fn parse(provider: Provider, route: &str) -> Result<Self, BadPassThrough> {
        let bad = |why: &str| BadPassThrough(format!("{route:?}: {why}"));
        let (method, path) = route
            .trim()
            .split_once(' ')
            .ok_or_else(|| bad("write a method and a path, e.g. \"GET /v1/files/*/content\""))?;
        let method = match method {
            "*" => None,
            m if !m.is_empty() && m.bytes().all(|b| b.is_ascii_uppercase()) => Some(
                Method::from_bytes(m.as_bytes()).map_err(|_| bad("the method is not a method"))?,
            ),
            _ => return Err(bad("the method is an upper-case word such as GET, or *")),
        };
        let path = path.trim();
        let Some(rest) = path.strip_prefix('/') else {
            return Err(bad("the path starts with /"));
        };
        if path.contains(['?', '#', '%', ';', '\\', ' ']) {
            return Err(bad(
                "the path is plain segments (no query, escapes, parameters or spaces)",
            ));
        }
        let segments: Vec<String> = rest.split('/').map(str::to_owned).collect();
        for (i, s) in segments.iter().enumerate() {
            if s.is_empty() && segments.len() > 1 || s == "." || s == ".." {
                return Err(bad("the path has no empty or dot segments"));
            }
            if s == "**" && i + 1 != segments.len() {
                return Err(bad("`**` may only end the path"));
            }
            if s.contains('*') && s != "*" && s != "**" {
                return Err(bad("`*` stands for a whole segment"));
            }
        }
        Ok(PassThrough {
            provider,
            method,
            segments,
            text: route.trim().to_owned(),
        })
    }

    /// The entry as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The provider the entry's requests go to.
    pub fn provider(&self) -> Provider {
        self.provider
    }

    pub(crate) fn matches(&self, method: &Method, path: &[&str]) -> bool {
        if self.method.as_ref().is_some_and(|m| m != method) {
            return false;
        }
        let mut want = self.segments.iter();
        let mut have = path.iter();
        loop {
            match (want.next().map(String::as_str), have.next()) {
                (Some("**"), _) => return true,
                (None, None) => return true,
                (Some("*"), Some(_)) => {}
                (Some(w), Some(h)) if w == *h => {}
                _ => return false,
            }
        }
    }
}

/// One `proxy.pass_through` entry as written.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PassThroughEntry {
    /// The provider whose upstream the requests go to.
    pub provider: Provider,
    /// `METHOD /path`, e.g. `GET /v1/files/*/content`.
    pub route: String,
}
