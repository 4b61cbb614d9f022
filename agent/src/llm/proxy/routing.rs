//! Where a request goes: the configured upstream base URLs, parsed once, and the choice
//! between them by dialect or, for a path that is not inspected, by its headers.

use anyhow::Context as _;
use hyper::body::Incoming;
use hyper::http::uri::{Authority, Scheme};
use hyper::{Request, Uri};

use super::Inner;
use crate::llm::Dialect;
use crate::llm::upstream::Origin;

/// A parsed upstream base URL.
#[derive(Debug, Clone)]
pub(super) struct Upstream {
    scheme: Scheme,
    authority: Authority,
    prefix: String,
    pub(super) origin: Origin,
}

impl Upstream {
    pub(super) fn parse(url: &str) -> anyhow::Result<Self> {
        let uri: Uri = url
            .parse()
            .with_context(|| format!("upstream URL {url:?} is not a URL"))?;
        let scheme = uri
            .scheme()
            .cloned()
            .with_context(|| format!("upstream URL {url:?} has no scheme (http or https)"))?;
        anyhow::ensure!(
            scheme == Scheme::HTTP || scheme == Scheme::HTTPS,
            "upstream URL {url:?}: only http and https are supported"
        );
        let authority = uri
            .authority()
            .cloned()
            .with_context(|| format!("upstream URL {url:?} has no host"))?;
        let tls = scheme == Scheme::HTTPS;
        let origin = Origin {
            tls,
            host: authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned(),
            port: authority.port_u16().unwrap_or(if tls { 443 } else { 80 }),
        };
        Ok(Upstream {
            scheme,
            authority,
            prefix: uri.path().trim_end_matches('/').to_owned(),
            origin,
        })
    }

    pub(super) fn uri(&self, path_and_query: &str) -> Result<Uri, hyper::http::Error> {
        Uri::builder()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(format!("{}{}", self.prefix, path_and_query))
            .build()
    }
}

pub(super) fn pick_upstream<'a>(
    inner: &'a Inner,
    dialect: Option<Dialect>,
    req: &Request<Incoming>,
    path: &str,
) -> &'a Upstream {
    match dialect {
        Some(Dialect::Anthropic) => &inner.anthropic,
        Some(_) => &inner.openai,
        None => {
            let h = req.headers();
            if h.contains_key("anthropic-version")
                || h.contains_key("x-api-key")
                || !path.starts_with("/v1/")
            {
                &inner.anthropic
            } else {
                &inner.openai
            }
        }
    }
}
