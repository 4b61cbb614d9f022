//! The floor under the filter proxy's cost: a relay built as the proxy is (hyper's HTTP/1
//! server, one hyper client connection per client connection, a single-threaded tokio
//! runtime) that judges nothing and passes each request and response on as it came. Run in
//! the same rounds as the proxy and nginx (`mcp-latency`), it shows what HTTP both ways costs
//! with hyper before a byte is judged.
//!
//! It runs as a process of its own, so its CPU is measured like nginx's: the bench binary
//! starts itself again with [`ENV`] set, and [`serve_if_asked`] serves instead of benching.

use std::convert::Infallible;
use std::sync::Arc;

use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

use super::*;

/// `<listen port> <upstream port>`: set, the bench binary is the relay.
const ENV: &str = "TOOLWALL_BENCH_HYPER_RELAY";

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Starts the relay in front of `127.0.0.1:upstream`; the process and its port.
pub(super) fn start(upstream: u16) -> Result<(Proc, u16), String> {
    let exe = std::env::current_exe().map_err(|e| format!("the bench binary's path: {e}"))?;
    let listen = free_port();
    let proc = start_listening(
        Command::new(exe).env(ENV, format!("{listen} {upstream}")),
        listen,
        "the bare hyper relay",
    )?;
    Ok((proc, listen))
}

/// Serves as the relay, and never returns, when [`ENV`] asks for it.
pub(super) fn serve_if_asked() {
    let Some(ports) = std::env::var_os(ENV) else {
        return;
    };
    let ports: Vec<u16> = ports
        .to_string_lossy()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect();
    let [listen, upstream] = ports[..] else {
        eprintln!("{ENV}: expected two ports");
        std::process::exit(2);
    };
    let served = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(BoxError::from)
        .and_then(|runtime| runtime.block_on(serve(listen, upstream)));
    if let Err(error) = served {
        eprintln!("the bare hyper relay: {error}");
    }
    std::process::exit(1);
}

async fn serve(listen: u16, upstream: u16) -> Result<(), BoxError> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", listen)).await?;
    loop {
        let (client, _) = listener.accept().await?;
        client.set_nodelay(true)?;
        // A client connection's requests come one at a time: one upstream connection each.
        let held: Arc<tokio::sync::Mutex<Option<SendRequest<Incoming>>>> = Arc::default();
        let service = hyper::service::service_fn(move |request: Request<Incoming>| {
            let held = held.clone();
            async move {
                let response = match pass(&held, upstream, request).await {
                    Ok(response) => response.map(|body| body.boxed()),
                    Err(error) => {
                        let mut response = Response::new(
                            http_body_util::Full::new(bytes::Bytes::from(error.to_string()))
                                .map_err(|never: Infallible| -> hyper::Error { match never {} })
                                .boxed(),
                        );
                        *response.status_mut() = hyper::StatusCode::BAD_GATEWAY;
                        response
                    }
                };
                Ok::<_, Infallible>(response)
            }
        });
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(client), service)
                .await;
        });
    }
}

/// Sends `request` as it came on the client connection's upstream connection (made when
/// there is none, or it closed).
async fn pass(
    held: &tokio::sync::Mutex<Option<SendRequest<Incoming>>>,
    upstream: u16,
    request: Request<Incoming>,
) -> Result<Response<Incoming>, BoxError> {
    let mut held = held.lock().await;
    let sender = match held.take().filter(|s| !s.is_closed()) {
        Some(sender) => held.insert(sender),
        None => {
            let stream = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await?;
            stream.set_nodelay(true)?;
            let (sender, connection) =
                hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
            tokio::spawn(connection);
            held.insert(sender)
        }
    };
    sender.ready().await?;
    Ok(sender.send_request(request).await?)
}
