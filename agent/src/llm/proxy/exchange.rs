//! One inspected exchange and its response body: a stream through its dialect's interceptor
//! (a [`Pump`] of `relay.rs`), a whole body rewritten, or the whole body of a route without
//! calls of its own (or of an error status) judged as one document.

use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use hyper::{Response, StatusCode};

use super::budget::{OverBudget, Reservation};
use super::{BoxError, Inner, ProxyBody, Reads, full};
use crate::llm::backstop;
use crate::llm::relay::{Pieces, Pump, Relay};
use crate::llm::{Dialect, Flow, Output, Record, StreamInterceptor, rewrite_buffered};

/// An inspected stream as a [`Pump`]: each read fed to the interceptor, its output queued.
struct Inspect {
    exchange: Exchange,
    /// Each read waits while the event queue is full: the records of one response are many
    /// (endless blocked calls would queue hundreds of MB).
    room: crate::events::RoomPoller,
    reads: Reads,
    interceptor: StreamInterceptor,
    output: Output,
    /// What the interceptor holds, of the proxy's memory budget.
    held: Reservation,
    /// Upstream ended, broke, or the interceptor closed the stream.
    done: bool,
}

impl Pump for Inspect {
    fn poll_step(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Pieces,
    ) -> Poll<Option<Result<(), BoxError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        ready!(self.room.poll_room(cx));
        let (mut flow, broke) = match ready!(self.reads.poll_next_unpin(cx)) {
            None => {
                self.interceptor.finish(&mut self.output);
                (Flow::Closed, None)
            }
            Some(Ok(bytes)) => (self.interceptor.feed(bytes, &mut self.output), None),
            Some(Err(e)) => {
                tracing::warn!(request_id = %self.exchange.request_id, error = %e, "upstream stream broke");
                self.interceptor.finish(&mut self.output);
                (Flow::Closed, Some(e))
            }
        };
        if let Err(over) = self.held.resize(self.interceptor.held_bytes()) {
            // Fail closed, this stream only: what it holds is not passed on unjudged, and the
            // other exchanges keep what they have.
            tracing::warn!(request_id = %self.exchange.request_id, held = self.interceptor.held_bytes(), "{over}: ending the stream");
            self.interceptor.stop(&mut self.output, &over.to_string());
            let _ = self.held.resize(0);
            flow = Flow::Closed;
        }
        self.exchange.emit(self.interceptor.drain_records());
        for chunk in self.output.drain() {
            out.push(chunk);
        }
        if let Some(e) = broke {
            // Let the client see the break, as it would without us.
            self.done = true;
            return Poll::Ready(Some(Err(Box::new(e))));
        }
        if flow == Flow::Closed {
            self.done = true;
            return Poll::Ready(None);
        }
        Poll::Ready(Some(Ok(())))
    }
}

impl Drop for Inspect {
    fn drop(&mut self) {
        if !self.done {
            // The client went away (or its connection was ended at shutdown): upstream and the
            // event sink are released with this body.
            tracing::info!(request_id = %self.exchange.request_id, "client went away mid-stream");
        }
    }
}

/// One inspected exchange.
pub(super) struct Exchange {
    pub(super) inner: Arc<Inner>,
    pub(super) dialect: Dialect,
    pub(super) request_id: String,
    pub(super) session: String,
    /// What the client holds of the memory budget (`budget.rs`).
    pub(super) client: super::budget::ClientBytes,
}

impl Exchange {
    /// Records and logs a blocked call the backstop found; the caller ends the response.
    pub(super) fn refused(&self, found: backstop::Found) {
        tracing::error!(request_id = %self.request_id, tool = %found.name, reason = %found.decision.reason, "backstop: a blocked tool call in a response; refused");
        self.emit(std::iter::once(Record {
            dialect: self.dialect,
            tool_name: found.name,
            tool_call_id: String::new(),
            input: None,
            decision: found.decision,
        }));
    }

    /// What judges this exchange's calls: the policy, and with approvals on, a person for
    /// the calls an argument rule asks about (`llm/asking.rs`).
    fn gate(&self) -> Arc<dyn crate::decision::Gate> {
        match &self.inner.approvals {
            Some(approvals) => Arc::new(crate::llm::asking::AskingGate {
                inner: self.inner.gate.clone(),
                approvals: approvals.clone(),
                session: self.session.clone(),
            }),
            None => self.inner.gate.clone(),
        }
    }

    pub(super) fn emit(&self, records: impl Iterator<Item = Record>) {
        for r in records {
            self.inner
                .sink
                .emit(r.into_event(chrono::Utc::now(), &self.session, &self.request_id));
        }
    }

    /// The response body: upstream read, inspected and written on the client connection's
    /// task, whatever is ready coalesced into one write ([`Relay`]).
    pub(super) fn stream(self, reads: Reads) -> ProxyBody {
        let settings = &self.inner.settings;
        let interceptor = StreamInterceptor::new(
            self.dialect,
            self.gate(),
            settings.on_malformed,
            settings.max_stream_buffer,
        );
        let stats = self.inner.stats.clone();
        Relay::new(Inspect {
            held: self.inner.budget.reserve(&self.client),
            room: self.inner.sink.room_poller(),
            exchange: self,
            reads,
            interceptor,
            output: Output::default(),
            done: false,
        })
        .counted(&stats)
        .boxed_unsync()
    }

    /// Reads a whole body, bounded by the buffer limit (past it: refused, 502) and the memory
    /// budget (past it: 503); the reservation is held while the body is judged.
    async fn read_whole(
        &self,
        mut reads: Reads,
    ) -> Result<(Vec<u8>, Reservation), Response<ProxyBody>> {
        let limit = self.inner.settings.max_stream_buffer;
        let mut body = Vec::new();
        let mut held = self.inner.budget.reserve(&self.client);
        while let Some(read) = reads.next().await {
            match read {
                Ok(read) if body.len() + read.len() <= limit => {
                    if let Err(over) = held.resize(body.len() + read.len()) {
                        tracing::warn!(request_id = %self.request_id, "{over}: refusing the response");
                        return Err(over_budget(over));
                    }
                    body.extend_from_slice(&read);
                }
                Ok(_) => {
                    tracing::error!(request_id = %self.request_id, limit, "response body over the buffer limit: refused");
                    return Err(full(
                        StatusCode::BAD_GATEWAY,
                        "toolwall: response too large to inspect",
                    ));
                }
                Err(e) => {
                    tracing::warn!(request_id = %self.request_id, error = %e, "upstream body broke");
                    return Err(full(
                        StatusCode::BAD_GATEWAY,
                        "toolwall: upstream body broke",
                    ));
                }
            }
        }
        Ok((body, held))
    }

    /// The whole body of a route that carries no call of its own (or of an error status),
    /// judged as one document by call shape (`backstop.rs`: a blocked call, or a call of a
    /// type toolwall does not know, refuses it), and refused if it names a provider URL an SDK
    /// would follow around the proxy.
    pub(super) async fn document(self, reads: Reads) -> Result<Bytes, Response<ProxyBody>> {
        let (body, _held) = self.read_whole(reads).await?;
        if let Some(found) = backstop::scan_body(&body, self.inner.gate.as_ref()) {
            self.refused(found);
            return Err(full(
                StatusCode::BAD_GATEWAY,
                "toolwall: the response holds a tool call toolwall refuses; refused",
            ));
        }
        if let Some(url) = super::urls::provider_url(&body, &self.inner.provider_origins()) {
            tracing::error!(request_id = %self.request_id, %url, "a response names a provider URL the client would follow around the proxy: refused");
            return Err(full(
                StatusCode::BAD_GATEWAY,
                format!(
                    "toolwall: the response names the provider URL {url}, which the client would fetch around the proxy; refused"
                ),
            ));
        }
        Ok(Bytes::from(body))
    }

    /// Reads a whole body (bounded), inspects and rewrites it, and runs the backstop over what
    /// is to be sent.
    pub(super) async fn buffered(self, reads: Reads) -> Result<Bytes, Response<ProxyBody>> {
        let (body, _held) = self.read_whole(reads).await?;
        if body.is_empty() {
            return Ok(Bytes::new());
        }
        match rewrite_buffered(
            self.dialect,
            &body,
            self.gate(),
            self.inner.settings.on_malformed,
        ) {
            Ok((new, records)) => {
                self.emit(records.into_iter());
                let out = new.map_or_else(|| Bytes::from(body), Bytes::from);
                // Whatever the dialect reading made of it (fail_open included), what leaves is
                // judged by call shape too (a call the dialect reading missed — an item with an
                // extra key, a custom tool call, JSON its strict reading refuses — still stops
                // the response).
                if let Some(found) = backstop::scan_body(&out, self.inner.gate.as_ref()) {
                    self.refused(found);
                    return Err(full(
                        StatusCode::BAD_GATEWAY,
                        "toolwall: the response holds a blocked tool call toolwall could not rewrite; refused",
                    ));
                }
                Ok(out)
            }
            Err(e) => {
                tracing::error!(request_id = %self.request_id, error = %e, "refusing an uninspectable body");
                Err(full(
                    StatusCode::BAD_GATEWAY,
                    "toolwall: response could not be inspected",
                ))
            }
        }
    }
}

/// The answer to an exchange the memory budget could not take: 503, the client may retry.
pub(super) fn over_budget(over: OverBudget) -> Response<ProxyBody> {
    full(StatusCode::SERVICE_UNAVAILABLE, format!("toolwall: {over}"))
}
