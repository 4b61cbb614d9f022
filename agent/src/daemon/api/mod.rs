//! The daemon's local API: JSON over HTTP on loopback (also the web view) and the same routes
//! on a Unix socket (for `toolwall exec`, the CLI views and the shims).
//!
//! | route | what |
//! |---|---|
//! | `GET /` | the web view of correlated calls |
//! | `GET /health` | layers on/off, kernel counters |
//! | `GET /metrics` | Prometheus/OpenMetrics text: decisions, events stored, queue, store, sessions, approvals, kernel counters (`daemon/metrics.rs`) |
//! | `GET /api/events?type=&session=&server=&tool=&action=&since=&after=&limit=` | stored events |
//! | `GET /api/calls?session=&server=&tool=&action=&since=&until=&limit=&before=&after=` | correlated call records, a page at a time (`Link: rel="next"`) |
//! | `GET /api/tools`, `GET /api/servers` | the registry |
//! | `GET /api/stream/events`, `GET /api/stream/calls` | live, as server-sent events |
//! | `POST /api/events` | record events (JSON lines), e.g. from a shim |
//! | `POST /api/check` | a call's decision (`{"server_id", "name", "namespace", "stage"}`; `stage` is `executing` unless `proposed`), spending the server's rate budget here, once for every process |
//! | `POST /api/listed` | listed tools' decisions (`{"server_id", "server_type", "tools": [...], "whole"}`; `whole`: the server's complete listing, which seals its set when pins are on), registering and pinning the tools here |
//! | `POST /api/sessions` `{"name"}` / `DELETE /api/sessions/NAME` | open / close a session |
//! | `GET /api/approvals`, `GET /api/stream/approvals` | calls waiting for a person (`approval.rs`), each with its id and digest; the stream sends the whole list at once and on every change |
//! | `POST /api/approvals` | a call a stand-alone shim or filter proxy holds, put to a person (JSON lines: its id, then the answer) |
//! | `POST /api/approvals/ID` `{"approve", "digest", "reason"}` | a person's answer to the question with that id and digest (409 with the waiting question when the digest is another's or missing) |
//!
//! Trust boundary: the loopback HTTP side is read-only and answers only requests addressed to
//! it by its own name (`Host` must be `127.0.0.1:PORT`, `localhost:PORT` or `[::1]:PORT`), so a
//! web page — even through DNS rebinding — can neither change anything nor read the events;
//! the one exception is the web view's answer to a waiting call (`api/approvals.rs`). Every
//! other route that changes something is served only on the Unix socket (the daemon's user),
//! and the session routes refuse a caller that runs inside a toolwall session, so an agent cannot
//! detach its own kernel programs.

use std::{convert::Infallible, net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use anyhow::Context;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::{
    net::{TcpListener, UnixListener},
    sync::{broadcast, watch},
    task::JoinSet,
};

use super::peer::{Holder, Kind, Place, SocketPeer};
use super::{DaemonState, READ_TIMEOUT, stdio};
use crate::mcp::relay;
use crate::sse::writer::encode_event;
use crate::{
    correlate::{Direction, Key, MAX_LIMIT, PageQuery, read_page},
    decision::{CallQuery, CallStage, Gate},
    events::{Event, EventQuery, Store},
};

/// Largest request body accepted (events are small; a batch of them stays well under this).
const MAX_BODY: usize = 16 * 1024 * 1024;

type Body = BoxBody<Bytes, Infallible>;

/// The running API.
pub(crate) struct ApiHandle {
    /// Where the HTTP side listens.
    pub http_addr: SocketAddr,
    /// The Unix socket.
    pub socket: PathBuf,
    /// The loopback API's token, readable by the daemon's user only.
    pub token_file: PathBuf,
    stop: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl ApiHandle {
    /// Stops accepting, gives open requests a moment, then ends every connection (live
    /// streams included) and removes the socket.
    pub(crate) async fn stop(mut self) {
        let _ = self.stop.send(true);
        let deadline = tokio::time::sleep(Duration::from_secs(2));
        tokio::pin!(deadline);
        loop {
            tokio::select! {
                next = self.tasks.join_next() => if next.is_none() { break },
                _ = &mut deadline => { self.tasks.abort_all(); break }
            }
        }
        remove_socket(&self.socket);
    }
}

/// Removes the daemon's socket at exit, if a socket is still what the path holds.
fn remove_socket(path: &std::path::Path) {
    use std::os::unix::fs::FileTypeExt;
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        let _ = std::fs::remove_file(path);
    }
}

/// Binds the loopback HTTP listener (before the kernel layer starts: sessions are denied its
/// address, `daemon/mod.rs`), or serves the one systemd holds for it.
pub(crate) async fn bind_http(
    listen: SocketAddr,
    activated: &mut crate::listen::Activated,
) -> anyhow::Result<TcpListener> {
    if let Some(held) = activated.take(listen, "api.listen")? {
        return TcpListener::from_std(held)
            .context("serve the socket systemd holds for api.listen");
    }
    TcpListener::bind(listen).await.with_context(|| {
        format!(
            "bind the API on {listen} (api.listen){}; is another toolwall running?",
            crate::listen::held_by(listen.port())
        )
    })
}

/// Binds the socket and serves both listeners until [`ApiHandle::stop`].
pub(crate) async fn start(state: Arc<DaemonState>, tcp: TcpListener) -> anyhow::Result<ApiHandle> {
    let http_addr = tcp.local_addr()?;
    let configured = state.config.api.socket.as_deref();
    let socket = crate::config::prepare_socket_dir(configured, true)?;
    // A socket file left by a daemon that died: nothing listens on it, so replace it. Never
    // anything else: `api.socket` pointing at the event database must not delete the record.
    if let Ok(meta) = std::fs::symlink_metadata(&socket) {
        use std::os::unix::fs::FileTypeExt;
        anyhow::ensure!(
            meta.file_type().is_socket(),
            "the API socket path {} (api.socket) exists and is not a socket; refusing to replace it: choose another path",
            socket.display()
        );
        if std::os::unix::net::UnixStream::connect(&socket).is_err() {
            let _ = std::fs::remove_file(&socket);
        }
    }
    let unix = UnixListener::bind(&socket).with_context(|| {
        format!(
            "bind the API socket {} (api.socket); is another toolwall running?",
            socket.display()
        )
    })?;
    {
        use std::os::unix::fs::PermissionsExt;
        // Open to all: see `Peer::Socket` for who may do what.
        std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666))
            .with_context(|| format!("open {} to local users", socket.display()))?;
    }

    let token_file = socket.with_file_name("web-token");
    let edge = Arc::new(Edge {
        origin: format!("http://{http_addr}"),
        token: write_token(&token_file)?,
    });
    let (stop, stopped) = watch::channel(false);
    let mut tasks = JoinSet::new();
    {
        let (state, mut stopped, edge) = (state.clone(), stopped.clone(), edge.clone());
        tasks.spawn(async move {
            let stop = async move {
                let _ = stopped.changed().await;
            };
            crate::edge::accept_loop(&tcp, stop, Duration::ZERO, |(stream, _), _| {
                Some(serve_conn(
                    TokioIo::new(stream),
                    state.clone(),
                    edge.clone(),
                    Peer::Loopback,
                    None,
                ))
            })
            .await;
        });
    }
    {
        let mut stopped = stopped;
        let quotas = super::peer::Quotas::new();
        tasks.spawn(async move {
            let stop = async move {
                let _ = stopped.changed().await;
            };
            crate::edge::accept_loop(&unix, stop, Duration::ZERO, |(stream, _), _| {
                let peer = Arc::new(SocketPeer::of(&stream));
                // Processes outside the host share the daemon within limits.
                let held = match peer.place(|n| state.server_session(n)) {
                    Place::Host => None,
                    place => {
                        let holder = Holder::of(&place, peer.uid);
                        match quotas.take(Kind::Connection, holder.clone()) {
                            Some(held) => Some(held),
                            None => {
                                tracing::debug!(
                                    "API connection refused: {holder} holds {} already",
                                    Kind::Connection.limit()
                                );
                                return None;
                            }
                        }
                    }
                };
                Some(serve_conn(
                    TokioIo::new(stream),
                    state.clone(),
                    edge.clone(),
                    Peer::Socket(peer),
                    held,
                ))
            })
            .await;
        });
    }
    Ok(ApiHandle {
        http_addr,
        socket,
        token_file,
        stop,
        tasks,
    })
}

/// What every request on this API is judged against.
#[derive(Debug)]
struct Edge {
    /// `http://ADDR` of the loopback listener.
    origin: String,
    /// The loopback API's bearer token (without it, every local user could read every
    /// session's events there).
    token: String,
}

/// A fresh random token, written to `path` readable by the daemon's user only (replacing the
/// last daemon's); the web view and the loopback API's readers present it.
fn write_token(path: &std::path::Path) -> anyhow::Result<String> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    let mut bytes = [0u8; 32];
    // SAFETY: getrandom writes at most `len` bytes into the buffer.
    let got = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    anyhow::ensure!(
        got == bytes.len() as isize,
        "no randomness for the web token: {}",
        std::io::Error::last_os_error()
    );
    let token = hex::encode(bytes);
    let _ = std::fs::remove_file(path);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("create the web token file {}", path.display()))?;
    file.write_all(token.as_bytes())
        .with_context(|| format!("write {}", path.display()))?;
    Ok(token)
}

/// Whether a loopback request carries the token (`Authorization: Bearer`, or `token=` in the
/// query for `EventSource`, which cannot set headers), compared in constant time.
fn has_token(req: &Request<Incoming>, query: &str, token: &str) -> bool {
    use subtle::ConstantTimeEq;
    let from_header = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::to_owned);
    let from_query = || {
        form_urlencoded::parse(query.as_bytes())
            .find(|(k, _)| k == "token")
            .map(|(_, v)| v.into_owned())
    };
    from_header
        .or_else(from_query)
        .is_some_and(|given| bool::from(given.as_bytes().ct_eq(token.as_bytes())))
}

/// Who is on the other end of a connection.
#[derive(Clone, Debug)]
enum Peer {
    /// The loopback HTTP listener: anyone on the host, browsers included.
    Loopback,
    /// The Unix socket. It is open to every local user (0666 in a 0711 directory) because
    /// `toolwall exec` runs agents as other users and their shims ask here for their servers;
    /// [`route`] lets a process that is not surely on the host do only that (and read
    /// `/health`).
    Socket(Arc<SocketPeer>),
}

async fn serve_conn<I>(
    io: TokioIo<I>,
    state: Arc<DaemonState>,
    edge: Arc<Edge>,
    peer: Peer,
    held: Option<super::peer::Held>,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let (state, edge, peer) = (state.clone(), edge.clone(), peer.clone());
        async move { Ok::<_, Infallible>(route(req, &state, &edge, &peer).await) }
    });
    if let Err(error) = hyper::server::conn::http1::Builder::new()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(READ_TIMEOUT)
        .serve_connection(io, service)
        .with_upgrades()
        .await
    {
        tracing::debug!(%error, "API connection ended with an error");
    }
    drop(held);
}

fn full(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header(header::CONTENT_TYPE, content_type)
        .body(Full::new(body.into()).boxed())
        .expect("static response parts are valid")
}

fn json_response<T: Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    match serde_json::to_vec(value) {
        Ok(body) => full(status, "application/json", body),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &format!("serialize response: {e}"),
        ),
    }
}

fn error(status: StatusCode, message: &str) -> Response<Body> {
    json_response(status, &json!({ "error": message }))
}

async fn route(
    req: Request<Incoming>,
    state: &Arc<DaemonState>,
    edge: &Edge,
    peer: &Peer,
) -> Response<Body> {
    let origin = edge.origin.as_str();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let method = req.method().clone();
    let mutating = method != Method::GET && method != Method::HEAD;
    if let Peer::Loopback = peer {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        let port = origin.rsplit(':').next().unwrap_or("");
        let ours = ["127.0.0.1", "localhost", "[::1]"]
            .iter()
            .any(|name| host == format!("{name}:{port}"));
        if !ours {
            return error(
                StatusCode::FORBIDDEN,
                "requests must be addressed to this API by its loopback address",
            );
        }
        let answering = method == Method::POST && path.starts_with(APPROVALS);
        if answering && let Err(why) = approvals::loopback_may_answer(&req, edge) {
            return error(StatusCode::FORBIDDEN, why);
        }
        if mutating && !answering {
            return error(
                StatusCode::FORBIDDEN,
                "the loopback HTTP API is read-only; changes go through the Unix socket",
            );
        }
        // The page holds no data; everything else needs the token.
        if path != "/" && !has_token(&req, &query, &edge.token) {
            return error(
                StatusCode::UNAUTHORIZED,
                "the loopback API needs the token the daemon wrote next to its socket (web-token, readable by its user only); open the web view with the URL `toolwall run` printed",
            );
        }
    }
    // The token is not a filter.
    let query: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form_urlencoded::parse(query.as_bytes()).filter(|(k, _)| k != "token"))
        .finish();
    // SAFETY: geteuid has no preconditions.
    let ours = unsafe { libc::geteuid() };
    let mut forced_session = None;
    let mut asker = None;
    if let Peer::Socket(peer) = peer {
        // A process inside a session (whoever it runs as) may only have the daemon run its
        // stdio servers, and read `/health`: it reads nothing (other sessions' events are not
        // its to read) and reports nothing and spends no rate budget (what it reported, it
        // could forge). Its shim
        // may not even know the session's name: in its own cgroup namespace its cgroup reads
        // `0::/`. A server the daemon runs for a session is of that session, and starts no
        // servers of its own.
        asker = peer
            .uid
            .zip(peer.gid)
            .map(|(uid, gid)| stdio::Asker { uid, gid });
        let place = peer.place(|name| state.server_session(name));
        let health_route = method == Method::GET && path == "/health";
        let stdio_route = method == Method::POST && path == relay::ROUTE;
        match place {
            Place::Session(session) if health_route || stdio_route => {
                forced_session = Some(session)
            }
            Place::Server { session } if health_route => forced_session = Some(session),
            Place::Host if peer.uid == Some(ours) => {}
            Place::Host => {
                return error(
                    StatusCode::FORBIDDEN,
                    &format!(
                        "this API serves uid {ours}; other users' processes are served only from inside a toolwall session"
                    ),
                );
            }
            Place::Unknown => {
                return error(
                    StatusCode::FORBIDDEN,
                    "cannot tell where the process that opened this connection runs (it has exited, or its pid is unknown): connect from the process that asks",
                );
            }
            Place::Server { .. } => {
                return error(
                    StatusCode::FORBIDDEN,
                    "a stdio MCP server the daemon runs may only read /health; it cannot start servers, report events, ask for decisions or read records",
                );
            }
            Place::Session(_) => {
                return error(
                    StatusCode::FORBIDDEN,
                    "a process inside a toolwall session may only ask the daemon to run its stdio MCP servers (toolwall shim) and read /health; it cannot open or close sessions, report events, ask for decisions or read records",
                );
            }
        }
    }
    let result = match (&method, path.as_str()) {
        (&Method::GET, "/") => Ok(full(
            StatusCode::OK,
            "text/html; charset=utf-8",
            super::web::PAGE.as_str(),
        )),
        (&Method::GET, "/health") => Ok(health(state, forced_session.as_deref())),
        (&Method::GET, "/api/events") => events(state, &query).await,
        (&Method::GET, "/api/calls") => calls(state, &query).await,
        (&Method::GET, "/api/tools") => Ok(tools(state)),
        (&Method::GET, "/api/servers") => Ok(json_response(
            StatusCode::OK,
            &state.policy.registry().servers(),
        )),
        (&Method::GET, "/api/stream/events") => Ok(stream(state.live_events.subscribe())),
        (&Method::GET, "/api/stream/calls") => Ok(stream(state.live_calls.subscribe())),
        (&Method::POST, "/api/events") => post_events(state, req).await,
        (&Method::POST, "/api/check") => check(state, req).await,
        (&Method::POST, "/api/listed") => listed(state, req).await,
        (&Method::POST, relay::ROUTE) => match (asker, peer) {
            (Some(asker), Peer::Socket(socket)) => {
                stdio::run(state, req, asker, socket, forced_session).await
            }
            _ => Ok(error(
                StatusCode::FORBIDDEN,
                "stdio servers are run only for processes on the Unix socket whose credentials are known",
            )),
        },
        (&Method::GET, "/metrics") => Ok(match state.metrics.render(state) {
            Ok(text) => full(
                StatusCode::OK,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                text,
            ),
            Err(_) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "metrics could not be written",
            ),
        }),
        (&Method::GET, "/api/approvals") => Ok(approvals::list(state)),
        (&Method::POST, "/api/approvals") => approvals::ask(state, req).await,
        (&Method::GET, "/api/stream/approvals") => Ok(approvals::stream(state)),
        (&Method::POST, p) if p.starts_with(APPROVALS) => {
            let by = match peer {
                Peer::Loopback => "the web view".to_owned(),
                Peer::Socket(socket) => match socket.uid {
                    Some(uid) => format!("uid {uid} (cli)"),
                    None => "the API socket".to_owned(),
                },
            };
            approvals::answer(state, req, &p[APPROVALS.len()..], by).await
        }
        (&Method::POST, "/api/sessions") => open_session(state, req).await,
        (&Method::DELETE, p) if p.starts_with("/api/sessions/") => {
            close_session(state, &p["/api/sessions/".len()..])
        }
        _ => Ok(error(
            StatusCode::NOT_FOUND,
            &format!("no route {method} {path}"),
        )),
    };
    result.unwrap_or_else(|e| error(StatusCode::BAD_REQUEST, &format!("{e:#}")))
}

/// Where a waiting call is answered: `POST /api/approvals/ID`.
const APPROVALS: &str = "/api/approvals/";

mod approvals;
mod reads;
mod writes;

use reads::{calls, events, health, stream, tools};
use writes::{check, close_session, listed, open_session, post_events};

#[cfg(test)]
mod tests {
    use super::reads::parse_query;

    #[test]
    fn query_parameters_are_validated() {
        let q = parse_query("type=mcp_tool_called&session=s%201&action=block&after=5&limit=10")
            .unwrap();
        assert_eq!(q.types, ["mcp_tool_called"]);
        assert_eq!(q.session.as_deref(), Some("s 1"));
        assert_eq!((q.after_id, q.limit), (Some(5), Some(10)));
        for bad in ["type=nope", "action=maybe", "after=x", "colour=red"] {
            assert!(parse_query(bad).is_err(), "{bad} accepted");
        }
    }
}
