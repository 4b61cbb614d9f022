//! The body of a Streamable HTTP response stream passed through the filter proxy: each event
//! of the upstream's body filtered as it arrives, on the client connection's own task.
//!
//! No task and no channel between the upstream and the client (one cross-task wake less per
//! event); the events that are ready together leave in one frame, our own replies (refused
//! calls) first. A POST's stream is complete once it carried a response for each request of
//! the POST (the MCP spec: the server then closes it): the client's body ends there, and
//! [`FilteredSse::gather`] lets the proxy answer a quick call in one write, head and body,
//! instead of mirroring the upstream's head, event and end chunk as three (a slow call's head
//! waits for its first event).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use tokio::sync::Notify;

use super::filter::{Filter, Turns};
use super::offload::{Away, Judging};
use crate::sse::message::{SseDecoder, SseEvent};
use crate::sse::writer::encode_event_into;

/// Most filtered bytes gathered before they are handed on (besides one message larger than
/// this, which the message limit bounds).
const FILL_LIMIT: usize = 256 << 10;

/// An upstream SSE body, filtered.
pub(crate) struct FilteredSse {
    upstream: Option<Incoming>,
    /// `None` while a large message is judged off the runtime's thread ([`Judging`]).
    filter: Option<Filter>,
    /// That judgement, with the event's type and id: nothing more is read or passed on
    /// until it is done, so the events keep their order.
    judging: Option<EventJudging>,
    /// Events decoded while one before them is judged, each message with the turn it took
    /// as it was decoded (`Filter::arrive`), so that a list among them is applied in the
    /// order it came, not when it is judged.
    waiting: VecDeque<(SseEvent, Option<u64>)>,
    /// Where they take their turns while the filter is away.
    turns: Turns,
    decoder: SseDecoder,
    /// Filtered bytes not yet handed to the client (our replies first).
    ready: BytesMut,
    /// Responses the stream owes the client (the POST's requests); `None` for a GET stream,
    /// which ends only when the upstream's does.
    owed: Option<usize>,
    /// How long the rest of a completed upstream body may take to be read (so its
    /// connection is kept) before it is dropped.
    drain_for: Duration,
    /// Wakes the proxy's watchdog when the upstream stream breaks: the upstream may be gone,
    /// or may only have dropped this one connection.
    probe: Arc<Notify>,
    /// While [`FilteredSse::gather`] runs: the unread rest of a completed upstream body is
    /// kept here for the caller ([`Gathered::rest`]) instead of being read by a task of its own.
    keep_rest: bool,
    rest: Option<Incoming>,
    /// Told once every owed response passed (never, when the stream ends or is dropped
    /// before that: the requests may still be running).
    on_answered: Option<Box<dyn FnOnce() + Send + Sync>>,
    /// The upstream's stream broke (or carried an event past the message limit) before it
    /// ended: the client's stream is broken too once what passed is handed on, never ended as
    /// if the server had ended it (a client would wait for an answer that cannot come).
    broke: bool,
    /// Data was handed on since the body last waited: hyper writes it out only once the body
    /// waits, and drops what it has not written when the body fails.
    handed: bool,
}

/// A large event judged off the runtime's thread, with what it is written out with once it
/// passed: its type and id.
struct EventJudging {
    judging: Judging<Option<Vec<u8>>>,
    event: Option<String>,
    id: Option<String>,
}

/// A response stream that completed while [`FilteredSse::gather`] waited.
pub(crate) struct Gathered {
    /// The whole filtered body.
    pub body: Bytes,
    /// What the upstream had not yet sent of its body when the last owed response passed
    /// (normally its end chunk, on its way): the caller reads it before it reuses the
    /// connection.
    pub rest: Option<Incoming>,
}

impl FilteredSse {
    pub(crate) fn new(
        upstream: Incoming,
        filter: Filter,
        replies: Vec<Vec<u8>>,
        probe: Arc<Notify>,
        max_message: usize,
    ) -> Self {
        let mut ready = BytesMut::new();
        for r in &replies {
            encode_event_into(&mut ready, Some("message"), None, r);
        }
        FilteredSse {
            upstream: Some(upstream),
            turns: filter.turns(),
            filter: Some(filter),
            judging: None,
            waiting: VecDeque::new(),
            decoder: SseDecoder::with_limit(max_message),
            ready,
            owed: None,
            drain_for: Duration::ZERO,
            probe,
            keep_rest: false,
            rest: None,
            on_answered: None,
            broke: false,
            handed: false,
        }
    }

    /// Calls `told` once every owed response ([`FilteredSse::answering`]) has passed.
    pub(crate) fn when_answered(mut self, told: impl FnOnce() + Send + Sync + 'static) -> Self {
        self.on_answered = Some(Box::new(told));
        self
    }

    /// The stream answers a POST of `requests` requests (the ones forwarded upstream): it is
    /// complete once that many responses passed. The upstream's remaining bytes (its end
    /// chunk) are then read in the background for up to `drain_for`.
    pub(crate) fn answering(mut self, requests: usize, drain_for: Duration) -> Self {
        self.owed = Some(self.filter.as_ref().map_or(0, Filter::responses) + requests);
        self.drain_for = drain_for;
        self
    }

    /// Waits (up to `limit`) for the upstream's first bytes, then takes what is ready with them.
    /// Returns the whole filtered body when that completed the stream (the proxy then answers
    /// with a plain body of known length), else `self` to stream on, with what was gathered
    /// so far sent first. No short timer: one earlier than the runtime's next would cost a
    /// wake-up of its driver (an eventfd write and an extra epoll_wait) on every call.
    ///
    /// A completed stream's unread rest is handed back ([`Gathered::rest`]) rather than read by
    /// a task spawned for it: a task and its timer on every call cost more than the read.
    pub(crate) async fn gather(mut self, limit: Duration) -> Result<Gathered, Self> {
        self.keep_rest = true;
        let first = std::future::poll_fn(|cx| match self.poll_fill(cx) {
            Poll::Pending if self.ready.is_empty() => Poll::Pending,
            _ => Poll::Ready(()),
        });
        let waited = tokio::time::timeout(limit, first).await;
        self.keep_rest = false;
        match waited {
            Ok(()) if self.upstream.is_none() && !self.broke => Ok(Gathered {
                body: self.ready.split().freeze(),
                rest: self.rest.take(),
            }),
            _ => Err(self),
        }
    }

    /// The upstream's stream broke before anything was ready for the client: the request can
    /// still be answered with an error status instead of a stream.
    pub(crate) fn broke_before_anything(&self) -> bool {
        self.broke && self.ready.is_empty()
    }

    fn complete(&self) -> bool {
        match (&self.filter, self.owed) {
            (Some(filter), Some(owed)) => filter.responses() >= owed,
            _ => false,
        }
    }

    /// Polls the judgement under way, if any: pending until it is done; then what it let
    /// through is handed on and the events decoded after it are judged. A lost judgement
    /// breaks the stream.
    fn poll_judging(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let Some(under_way) = self.judging.as_mut() else {
            return Poll::Ready(());
        };
        let judged = std::task::ready!(Pin::new(&mut under_way.judging).poll(cx));
        let Some(EventJudging { event, id, .. }) = self.judging.take() else {
            return Poll::Ready(());
        };
        match judged {
            Some((filter, forward)) => {
                self.filter = Some(filter);
                if let Some(data) = forward {
                    self.ready.reserve(data.len() + 64);
                    encode_event_into(&mut self.ready, event.as_deref(), id.as_deref(), &data);
                }
                self.drain();
            }
            None => {
                tracing::error!("judging an upstream event failed; ending its stream");
                self.upstream = None;
                self.broke = true;
            }
        }
        Poll::Ready(())
    }

    /// Reads what the upstream has ready into `ready`, up to [`FILL_LIMIT`]. Ready when the
    /// stream is over (the upstream ended or broke, or every owed response passed); pending
    /// otherwise (with `ready` full, without waiting to be woken: it is handed on first).
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            // A judgement under way holds everything after it back; one that ended may have
            // begun the next (the events decoded after it are judged as it ends).
            std::task::ready!(self.poll_judging(cx));
            if self.judging.is_some() {
                continue;
            }
            // Complete first: what follows the last owed response (even an event past the
            // limit, in the same read) is not the client's to wait for.
            if self.complete() {
                if let Some(told) = self.on_answered.take() {
                    told();
                }
                self.finish_upstream(cx);
                return Poll::Ready(());
            }
            if self.upstream.is_some() && self.decoder.overflowed() {
                tracing::warn!(
                    "an upstream SSE event is larger than the message limit; ending its stream"
                );
                self.upstream = None;
                self.broke = true;
            }
            // Enough for one write: the client takes it before more is read, so an upstream
            // that writes faster than its client reads is held back by TCP, not buffered here.
            if self.ready.len() >= FILL_LIMIT && self.upstream.is_some() {
                return Poll::Pending;
            }
            let Some(upstream) = self.upstream.as_mut() else {
                return Poll::Ready(());
            };
            match Pin::new(upstream).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        self.decoder.feed(data);
                        self.drain();
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    tracing::warn!("an upstream SSE stream broke: {e}; probing the upstream");
                    self.probe.notify_one();
                    self.upstream = None;
                    self.broke = true;
                }
                Poll::Ready(None) => self.upstream = None,
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// The client has all it is owed: the upstream's rest (normally just its end chunk) is
    /// read in the background, so the connection can serve the next request. What already
    /// arrived is read here: a server's end chunk usually comes in the same segment as its
    /// last event, and a task spawned per call for it cost more than the read.
    fn finish_upstream(&mut self, cx: &mut Context<'_>) {
        let Some(mut upstream) = self.upstream.take() else {
            return;
        };
        // A few frames at most: a server streaming on past its answers goes to the task.
        for _ in 0..4 {
            if upstream.is_end_stream() {
                return;
            }
            match Pin::new(&mut upstream).poll_frame(cx) {
                Poll::Ready(Some(Ok(_))) => continue,
                Poll::Ready(Some(Err(_)) | None) => return,
                Poll::Pending => break,
            }
        }
        if self.keep_rest {
            self.rest = Some(upstream);
            return;
        }
        let drain_for = self.drain_for;
        tokio::spawn(async move {
            let rest = async {
                while let Some(frame) = upstream.frame().await {
                    if frame.is_err() {
                        return;
                    }
                }
            };
            let _ = tokio::time::timeout(drain_for, rest).await;
        });
    }

    /// Every complete event decoded so far, filtered and encoded into `ready`.
    fn drain(&mut self) {
        loop {
            if self.judging.is_some() {
                // What was read already came before anything read later, on any stream of
                // the session: its messages take their turns now, and wait.
                while let Some(event) = self.decoder.next_event() {
                    let turn =
                        (event.is_message() && !event.data.is_empty()).then(|| self.turns.take());
                    self.waiting.push_back((event, turn));
                }
                return;
            }
            let Some(filter) = self.filter.as_mut() else {
                return;
            };
            let (event, turn) = match self.waiting.pop_front() {
                Some(waited) => waited,
                None => match self.decoder.next_event() {
                    Some(event) => (event, None),
                    None => return,
                },
            };
            if let Some(turn) = turn {
                filter.arrived(turn);
            }
            if event.is_message()
                && let Some(away) = Away::take(event.data.len())
            {
                let Some(mut filter) = self.filter.take() else {
                    return;
                };
                if turn.is_none() {
                    filter.arrive();
                }
                // Recorded there: what was judged is recorded even if the client left.
                let judging = Judging::start(
                    away,
                    filter,
                    move |filter| {
                        let out = filter.on_server(&event.data);
                        out.record(filter.sink()).forward.map(|f| f.into_owned())
                    },
                    drop,
                );
                self.judging = Some(EventJudging {
                    judging,
                    event: event.event,
                    id: event.id,
                });
                continue;
            }
            if event.is_message() && !event.data.is_empty() {
                let out = filter.on_server(&event.data);
                if let Some(data) = out.record(filter.sink()).forward {
                    // One allocation for the event, not one per doubling as it is written.
                    self.ready.reserve(encoded_len(&event, &data));
                    encode_event_into(
                        &mut self.ready,
                        event.event.as_deref(),
                        event.id.as_deref(),
                        &data,
                    );
                }
            } else {
                encode_event_into(
                    &mut self.ready,
                    event.event.as_deref(),
                    event.id.as_deref(),
                    &event.data,
                );
            }
        }
    }
}

/// Room for `data` written as `event`'s SSE event: exact unless the data holds line breaks
/// (then a few more `data: ` prefixes follow).
fn encoded_len(event: &crate::sse::message::SseEvent, data: &[u8]) -> usize {
    let field = |v: Option<&str>| v.map_or(0, |v| v.len() + 8);
    field(event.event.as_deref()) + field(event.id.as_deref()) + data.len() + 8
}

/// What a client's stream ends with when the upstream's broke.
#[derive(Debug, thiserror::Error)]
#[error("the upstream MCP server's response stream broke before it ended")]
pub(crate) struct UpstreamStreamBroke;

impl Body for FilteredSse {
    type Data = Bytes;
    type Error = UpstreamStreamBroke;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let over = this.poll_fill(cx).is_ready();
        if !this.ready.is_empty() {
            this.handed = true;
            return Poll::Ready(Some(Ok(Frame::data(this.ready.split().freeze()))));
        }
        match over {
            // What passed goes out before the break: the body waits once (woken at once), so
            // hyper writes the data handed on, then learns of the break (which ends the
            // connection, and would drop data not yet written).
            true if this.broke && std::mem::take(&mut this.handed) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            // Once: the connection that carries it is ended by it.
            true if std::mem::take(&mut this.broke) => Poll::Ready(Some(Err(UpstreamStreamBroke))),
            true => Poll::Ready(None),
            false => {
                this.handed = false;
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.upstream.is_none() && self.judging.is_none() && self.ready.is_empty() && !self.broke
    }

    fn size_hint(&self) -> SizeHint {
        match self.upstream.is_none() && self.judging.is_none() && !self.broke {
            true => SizeHint::with_exact(self.ready.len() as u64),
            false => SizeHint::default(),
        }
    }
}
