//! The body of a Streamable HTTP response stream passed through the filter proxy: each event
//! of the upstream's body filtered as it arrives, on the client connection's own task.
//!
//! No task and no channel between the upstream and the client (one cross-task wake less per
//! event); the events that are ready together leave in one frame, our own
//! replies (refused calls) first.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, Incoming};
use tokio::sync::Notify;

use super::filter::Filter;
use super::sse::{SseDecoder, encode_event};

/// An upstream SSE body, filtered.
pub(crate) struct FilteredSse {
    upstream: Option<Incoming>,
    filter: Filter,
    decoder: SseDecoder,
    /// Our replies, sent before anything of the upstream's.
    first: Option<Bytes>,
    /// Wakes the proxy's watchdog when the upstream stream breaks: the upstream may be gone,
    /// or may only have dropped this one connection.
    probe: Arc<Notify>,
}

impl FilteredSse {
    pub(crate) fn new(
        upstream: Incoming,
        filter: Filter,
        replies: Vec<Vec<u8>>,
        probe: Arc<Notify>,
    ) -> Self {
        let first: Vec<u8> = replies
            .iter()
            .flat_map(|r| encode_event(Some("message"), None, r))
            .collect();
        FilteredSse {
            upstream: Some(upstream),
            filter,
            decoder: SseDecoder::new(),
            first: (!first.is_empty()).then(|| Bytes::from(first)),
            probe,
        }
    }

    /// Every complete event decoded so far, filtered and encoded into `out`.
    fn drain(&mut self, out: &mut BytesMut) {
        while let Some(event) = self.decoder.next_event() {
            if event.is_message() && !event.data.is_empty() {
                if let Some(data) = self.filter.from_server(&event.data).forward {
                    out.extend_from_slice(&encode_event(
                        event.event.as_deref(),
                        event.id.as_deref(),
                        &data,
                    ));
                }
            } else {
                out.extend_from_slice(&encode_event(
                    event.event.as_deref(),
                    event.id.as_deref(),
                    &event.data,
                ));
            }
        }
    }
}

impl Body for FilteredSse {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut out = BytesMut::new();
        if let Some(first) = self.first.take() {
            out.extend_from_slice(&first);
        }
        loop {
            let Some(upstream) = self.upstream.as_mut() else {
                return Poll::Ready(None);
            };
            match Pin::new(upstream).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    if let Some(data) = frame.data_ref() {
                        self.decoder.feed(data);
                        self.drain(&mut out);
                    }
                    // Keep reading what is ready, so events that came together leave together.
                    continue;
                }
                Poll::Ready(Some(Err(e))) => {
                    tracing::warn!("an upstream SSE stream broke: {e}; probing the upstream");
                    self.probe.notify_one();
                    self.upstream = None;
                }
                Poll::Ready(None) => self.upstream = None,
                Poll::Pending if out.is_empty() => return Poll::Pending,
                Poll::Pending => {}
            }
            return match out.is_empty() {
                true => Poll::Ready(None),
                false => Poll::Ready(Some(Ok(Frame::data(out.freeze())))),
            };
        }
    }
}
