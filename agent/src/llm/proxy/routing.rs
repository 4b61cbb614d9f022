//! Where a request goes: the configured upstream base URLs, parsed once, one per provider
//! (which provider a route belongs to is `llm/routes.rs`'s answer).

use anyhow::Context as _;
use hyper::Uri;
use hyper::http::uri::{Authority, Scheme};

use super::Inner;
use crate::config::Provider;
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

/// The upstream of `provider`.
pub(super) fn upstream_of(inner: &Inner, provider: Provider) -> &Upstream {
    match provider {
        Provider::Anthropic => &inner.anthropic,
        Provider::Openai => &inner.openai,
        Provider::Gemini => &inner.gemini,
    }
}
