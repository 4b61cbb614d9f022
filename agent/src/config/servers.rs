//! The declared MCP servers: their schema, their `egress:` lists, and the host and port of
//! their URLs.

use std::{collections::BTreeMap, fmt, path::PathBuf};

use serde::{Deserialize, Serialize};

/// One declared MCP server.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ServerDecl {
    /// The id rules and agents refer to (Claude Code's `mcp__<id>__<tool>`).
    pub id: String,
    /// Transport.
    #[serde(rename = "type")]
    pub server_type: ServerType,
    /// Program to start (stdio only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Its arguments (stdio only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Its whole environment besides `PATH` and `HOME` (stdio only): the daemon runs a declared
    /// server with this, not with the environment of the agent that asked (whose
    /// `LD_PRELOAD`, `PYTHONPATH` or `NODE_OPTIONS` would run the agent's code in it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Its working directory (stdio only; default `/`): never the agent's, whose files
    /// (`node_modules`, Python modules) the server would load.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// The user it runs as (stdio only; default: the agent's user, which can then reach into
    /// it through its own files and ptrace — name a user of its own to keep the agent out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Where it may connect (stdio only, enforced by the kernel layer): `ADDR`, `ADDR:PORT`,
    /// `NET/BITS`, `NET/BITS:PORT` (IPv6 in brackets: `[::1]:53`), or `any`. Empty: nowhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub egress: Vec<String>,
    /// Endpoint (http and sse only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Expected TLS certificate fingerprint, `sha256:<hex>` (network only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_fingerprint: Option<String>,
    /// Must this server be reached through `toolwall mcp-proxy`? Overrides `netmon.deny_direct`
    /// (network only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via_proxy: Option<bool>,
}

impl ServerDecl {
    /// `host:port` of a network server's URL (default port from the scheme), empty for stdio
    /// or an unparsable URL: the registry's `server_addr`.
    pub(crate) fn addr(&self) -> String {
        self.url.as_deref().map(url_host_port).unwrap_or_default()
    }
}

/// One `egress:` entry of a stdio server: a network (an address is a /32 or /128) and a port
/// (0: any).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EgressRule {
    /// The network's address.
    pub addr: std::net::IpAddr,
    /// Its prefix length.
    pub prefix: u8,
    /// The port, 0 for any.
    pub port: u16,
}

/// What an `egress:` list allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Egress {
    /// `any`: no limit.
    Any,
    /// These destinations only (none when empty).
    Only(Vec<EgressRule>),
}

impl ServerDecl {
    /// The parsed `egress:` list; the error names the entry.
    pub(crate) fn egress(&self) -> Result<Egress, String> {
        if self.egress.iter().any(|e| e == "any") {
            return if self.egress.len() == 1 {
                Ok(Egress::Any)
            } else {
                Err("`any` allows everything: list it alone".to_owned())
            };
        }
        self.egress
            .iter()
            .map(|e| parse_egress(e).ok_or_else(|| format!("{e:?} is not ADDR, ADDR:PORT, NET/BITS or NET/BITS:PORT (IPv6 in brackets: [::1]:53)")))
            .collect::<Result<_, _>>()
            .map(Egress::Only)
    }
}

/// Longest server id.
pub(crate) const MAX_SERVER_ID: usize = 128;

/// The form a server id must have, for error messages.
pub(crate) const SERVER_ID_FORM: &str =
    "1 to 128 characters of letters, digits and . _ - : @ / [ ] (no spaces or control characters)";

/// A server id a shim gave or a configuration declared that is not of the conservative form.
#[derive(Debug, thiserror::Error)]
#[error("server id {id:?} is not {SERVER_ID_FORM}")]
pub(crate) struct BadServerId {
    /// The id as given (escaped by `{:?}` in the message).
    pub id: String,
}

/// Is `id` of the conservative form ([`SERVER_ID_FORM`])? An id with a trailing space or
/// another look of a declared id (`"everything "`) passed as an undeclared server and showed
/// as the declared one; ids are names, so nothing a person cannot see or tell apart is allowed
/// (the brackets are for the filter proxy's ids derived from an IPv6 upstream, `[::1]:8080`).
pub(crate) fn check_server_id(id: &str) -> Result<(), BadServerId> {
    let fits = |c: char| c.is_ascii_alphanumeric() || "._-:@/[]".contains(c);
    if id.is_empty() || id.len() > MAX_SERVER_ID || !id.chars().all(fits) {
        return Err(BadServerId { id: id.to_owned() });
    }
    Ok(())
}

/// Why a server id cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UnusableServerId {
    #[error(transparent)]
    Form(#[from] BadServerId),
    #[error(
        "MCP server id {id:?} looks like declared server {declared:?} (the same once case, separators and look-alike characters are set aside); refused: use the declared id, or a name of its own"
    )]
    LooksLike { id: String, declared: String },
}

/// The declared server `id` names, if any; refuses an id not of the conservative form and an
/// undeclared one that reads as a declared one (`Everything`, `everything.`, `everyth1ng` for
/// `everything`): it would run its own command and show in the views
/// as the declared server. Asked by the daemon's relay (`daemon/stdio.rs`: anyone may write to
/// its socket) and by a stand-alone shim with a config.
pub(crate) fn declared_server<'a>(
    servers: &'a [ServerDecl],
    id: &str,
) -> Result<Option<&'a ServerDecl>, UnusableServerId> {
    check_server_id(id)?;
    if let Some(server) = servers.iter().find(|s| s.id == id) {
        return Ok(Some(server));
    }
    let skeleton = id_skeleton(id);
    match servers.iter().find(|s| id_skeleton(&s.id) == skeleton) {
        Some(server) => Err(UnusableServerId::LooksLike {
            id: id.to_owned(),
            declared: server.id.clone(),
        }),
        None => Ok(None),
    }
}

/// A server id (ASCII, [`check_server_id`]) with case and separators set aside and the
/// look-alike characters as one (`1`, `l`, `|` as `i`; `0` as `o`; `rn` as `m`; `vv` as `w`),
/// as `policy/definitions.rs` reads tool names.
fn id_skeleton(id: &str) -> String {
    let letters: String = id
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            'l' | '1' | '|' => 'i',
            '0' => 'o',
            c => c,
        })
        .filter(char::is_ascii_alphanumeric)
        .collect();
    letters.replace("rn", "m").replace("vv", "w")
}

/// One `netmon.egress.allow` entry: a network as in a server's `egress:`, or a host name and
/// port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum AllowEntry {
    /// An address or network, and a port (0: any).
    Net(EgressRule),
    /// A host name, resolved like a server's.
    Name { host: String, port: u16 },
}

/// Parses a `netmon.egress.allow` entry; the error says what forms there are.
pub(crate) fn parse_allow(entry: &str) -> Result<AllowEntry, String> {
    if let Some(rule) = parse_egress(entry) {
        return Ok(AllowEntry::Net(rule));
    }
    let name = |host: &str| {
        !host.is_empty()
            && host.len() <= 253
            && host
                .split('.')
                .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
            && host.parse::<std::net::IpAddr>().is_err()
    };
    match entry.rsplit_once(':') {
        Some((host, port)) if name(host) => match port.parse::<u16>() {
            Ok(port) if port != 0 => Ok(AllowEntry::Name {
                host: host.to_ascii_lowercase(),
                port,
            }),
            _ => Err(format!("{entry:?}: {port:?} is not a port (1 to 65535)")),
        },
        _ => Err(format!(
            "{entry:?} is not ADDR, ADDR:PORT, NET/BITS, NET/BITS:PORT or HOST:PORT (IPv6 in brackets: [fd00::1]:5432; a host name needs its port)"
        )),
    }
}

fn parse_egress(entry: &str) -> Option<EgressRule> {
    let (net, port) = if let Some(rest) = entry.strip_prefix('[') {
        let (net, after) = rest.split_once(']')?;
        match after {
            "" => (net, 0),
            _ => (net, after.strip_prefix(':')?.parse().ok()?),
        }
    } else {
        match entry.split_once(':') {
            Some((net, port)) => (net, port.parse().ok()?),
            None => (entry, 0),
        }
    };
    let (addr, prefix) = match net.split_once('/') {
        Some((addr, bits)) => (
            addr.parse::<std::net::IpAddr>().ok()?,
            bits.parse::<u8>().ok()?,
        ),
        None => {
            let addr = net.parse::<std::net::IpAddr>().ok()?;
            (addr, if addr.is_ipv4() { 32 } else { 128 })
        }
    };
    let most = if addr.is_ipv4() { 32 } else { 128 };
    (prefix <= most).then_some(EgressRule { addr, prefix, port })
}

/// What makes two URLs one server's: scheme and host in lower case, user, port (the default
/// written out), path without a trailing `/`, and query. `None`: not a URL with a scheme
/// and a host.
pub(crate) fn url_key(url: &str) -> Option<(String, String, String, u16, String, String)> {
    let uri = url.parse::<http::Uri>().ok()?;
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let authority = uri.authority()?.as_str();
    let user = authority
        .rsplit_once('@')
        .map(|(user, _)| user.to_owned())
        .unwrap_or_default();
    // A port is digits that fit 16 bits (`+443`, `66979` are no port: no URL; `http` reads
    // them as none); none written, or an empty one, is the scheme's.
    let host_port = authority.rsplit('@').next().unwrap_or_default();
    let after_host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map_or("", |(_, rest)| rest),
        None => host_port.find(':').map_or("", |i| &host_port[i..]),
    };
    let port = match after_host.strip_prefix(':').filter(|p| !p.is_empty()) {
        Some(port) if port.bytes().all(|b| b.is_ascii_digit()) => port.parse::<u16>().ok()?,
        Some(_) => return None,
        None => match scheme.as_str() {
            "https" => 443,
            _ => 80,
        },
    };
    Some((
        scheme,
        user,
        uri.host()?.to_ascii_lowercase(),
        port,
        uri.path().trim_end_matches('/').to_owned(),
        uri.query().unwrap_or("").to_owned(),
    ))
}

/// Whether two URLs are one server's ([`url_key`]); never when either is no URL.
pub(crate) fn same_server_url(a: &str, b: &str) -> bool {
    url_key(a).is_some_and(|a| url_key(b).as_ref() == Some(&a))
}

/// `host:port` of an `http(s)://` URL, for matching connections to servers.
pub(crate) fn url_host_port(url: &str) -> String {
    let (default_port, rest) = if let Some(rest) = url.strip_prefix("https://") {
        (443, rest)
    } else if let Some(rest) = url.strip_prefix("http://") {
        (80, rest)
    } else {
        return String::new();
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit('@').next().unwrap_or_default();
    if authority.is_empty() {
        return String::new();
    }
    // `[v6]:port`, `[v6]`, `host:port`, `host`.
    let has_port = match authority.rfind(':') {
        Some(i) => !authority.starts_with('[') || authority[..i].ends_with(']'),
        None => false,
    };
    if has_port {
        authority.to_string()
    } else {
        format!("{authority}:{default_port}")
    }
}

/// MCP transports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ServerType {
    /// A child process speaking JSON-RPC on stdin/stdout.
    Stdio,
    /// Streamable HTTP.
    Http,
    /// Legacy HTTP+SSE.
    Sse,
}

impl ServerType {
    /// `stdio`, `http` or `sse`, as in events and the registry.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ServerType::Stdio => "stdio",
            ServerType::Http => "http",
            ServerType::Sse => "sse",
        }
    }
}

impl fmt::Display for ServerType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
