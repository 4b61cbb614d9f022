//! The streaming interceptor: SSE events decoded from upstream reads in any chunking, each
//! handed to the response's dialect machine, runs of events that cannot hold a tool call
//! forwarded unparsed, and the backstop's last look at everything before it leaves.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::{
    Cx, Dialect, Fatal, Keys, OnMalformed, Record, SseDecoder, SseEvent, anthropic, backstop, chat,
    gemini, responses, trim_ws,
};
use crate::decision::Gate;

/// A dialect's streaming state machine: one complete SSE event in, output written.
pub(crate) trait Machine {
    /// Handles one event with data (`raw`: its bytes, line ends included; `body`: its data,
    /// JSON whitespace trimmed).
    fn on_data(
        &mut self,
        cx: &mut Cx,
        raw: &Bytes,
        body: &[u8],
        out: &mut BytesMut,
    ) -> Result<(), Fatal>;
    /// An event without data (a comment, a bare `event:`): passes as it is unless a dialect
    /// must keep it in order with what it holds, or reads it (Gemini's SDKs read lines).
    fn on_dataless(&mut self, _cx: &mut Cx, raw: &Bytes, out: &mut BytesMut) -> Result<(), Fatal> {
        out.extend_from_slice(raw);
        Ok(())
    }
    /// The stream ended (cleanly or not): release or drop what is held, record what is open.
    fn on_end(&mut self, cx: &mut Cx, out: &mut BytesMut);
    /// Writes a terminal error event the dialect's SDKs understand.
    fn write_error(&self, out: &mut BytesMut, message: &str);
    /// While `Some`: an event in which none of these keys occurs passes verbatim and changes
    /// nothing, so a run of such events may skip [`Machine::on_event`]. `None` while a call is
    /// open (held, blocked or followed): then every event is looked at.
    fn quiet_keys(&self) -> Option<&'static Keys>;
    /// Bytes held back now (events and call state kept until a call is decided): counted
    /// against the proxy's memory budget after each read, so it must be O(1).
    fn held_bytes(&self) -> usize;
}

enum AnyMachine {
    Anthropic(anthropic::Anthropic),
    Chat(chat::Chat),
    Responses(responses::Responses),
    Gemini(gemini::Gemini),
}

impl AnyMachine {
    fn get(&mut self) -> &mut dyn Machine {
        match self {
            AnyMachine::Anthropic(m) => m,
            AnyMachine::Chat(m) => m,
            AnyMachine::Responses(m) => m,
            AnyMachine::Gemini(m) => m,
        }
    }

    fn held_bytes(&self) -> usize {
        match self {
            AnyMachine::Anthropic(m) => m.held_bytes(),
            AnyMachine::Chat(m) => m.held_bytes(),
            AnyMachine::Responses(m) => m.held_bytes(),
            AnyMachine::Gemini(m) => m.held_bytes(),
        }
    }
}

/// Whether the stream goes on after a [`StreamInterceptor::feed`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Keep feeding.
    Continue,
    /// The interceptor ended the stream (fail closed); stop reading upstream and close the
    /// response after writing the output.
    Closed,
}

/// What an interceptor passes on, in order: runs of the input forwarded as they came (slices of
/// the reads, not copies) and the bytes it wrote itself.
#[derive(Debug, Default)]
pub(crate) struct Output {
    ready: Vec<Bytes>,
    /// Which of `ready` a machine wrote (the others are runs forwarded unparsed, which hold no
    /// tool key).
    machine_written: Vec<bool>,
    /// How many of `ready` the backstop has read.
    checked: usize,
    written: BytesMut,
}

impl Output {
    fn run(&mut self, run: Bytes) {
        self.seal();
        self.ready.push(run);
        self.machine_written.push(false);
    }

    fn seal(&mut self) {
        if !self.written.is_empty() {
            self.ready.push(self.written.split().freeze());
            self.machine_written.push(true);
        }
    }

    /// Takes everything produced so far, in order.
    pub(crate) fn drain(&mut self) -> std::vec::Drain<'_, Bytes> {
        self.seal();
        self.machine_written.clear();
        self.checked = 0;
        self.ready.drain(..)
    }

    /// Takes everything produced so far as one buffer (for callers that want bytes, not
    /// chunks: tests, fuzzers).
    #[cfg(any(test, feature = "bench", feature = "fuzzing"))]
    pub(crate) fn take_all(&mut self) -> Vec<u8> {
        self.drain().flat_map(|b| b.to_vec()).collect()
    }
}

/// Inspects one streamed (SSE) response: feed upstream bytes in any chunking, write the output
/// to the client as soon as `feed` returns. Events with nothing blocked leave byte-identical.
pub(crate) struct StreamInterceptor {
    decoder: SseDecoder,
    machine: AnyMachine,
    cx: Cx,
    closed: bool,
    /// The last event's output ended with a CR (so a split-off LF completes it).
    last_ended_cr: bool,
}

impl StreamInterceptor {
    /// An interceptor for one response; `max_buffer` bounds the memory held for one incomplete
    /// event or one held-back tool call.
    pub(crate) fn new(
        dialect: Dialect,
        gate: Arc<dyn Gate>,
        on_malformed: OnMalformed,
        max_buffer: usize,
    ) -> Self {
        let machine = match dialect {
            Dialect::Anthropic => AnyMachine::Anthropic(anthropic::Anthropic::new(max_buffer)),
            Dialect::OpenAiChat => AnyMachine::Chat(chat::Chat::new(max_buffer)),
            Dialect::OpenAiResponses => {
                AnyMachine::Responses(responses::Responses::new(max_buffer))
            }
            Dialect::Gemini => AnyMachine::Gemini(gemini::Gemini::new(max_buffer)),
        };
        StreamInterceptor {
            decoder: SseDecoder::new(max_buffer),
            machine,
            cx: Cx {
                gate,
                dialect,
                on_malformed,
                records: Vec::new(),
            },
            closed: false,
            last_ended_cr: false,
        }
    }

    /// Feeds a read from upstream; appends what the client must receive to `out`.
    pub(crate) fn feed(&mut self, input: Bytes, out: &mut Output) -> Flow {
        let flow = self.feed_events(input, out);
        if self.backstop(out) {
            return Flow::Closed;
        }
        flow
    }

    fn feed_events(&mut self, input: Bytes, out: &mut Output) -> Flow {
        if self.closed {
            return Flow::Closed;
        }
        self.decoder.feed(input);
        loop {
            if let Some(keys) = self.machine.get().quiet_keys()
                && let Some(run) = self.decoder.take_run(|b| keys.find(b))
            {
                out.run(run);
                self.last_ended_cr = false;
            }
            let out = &mut out.written;
            match self.decoder.next_event() {
                Ok(Some(raw)) => {
                    if self.decoder.is_crlf_tail() {
                        if self.last_ended_cr {
                            out.extend_from_slice(&raw);
                        }
                        self.last_ended_cr = false;
                        continue;
                    }
                    let before = out.len();
                    let data = self.decoder.last_data().data(&raw);
                    if let Err(fatal) = self.on_event(&raw, data, out) {
                        return self.close(out, &fatal.0);
                    }
                    // Verbatim output ends as the input did; our own events end in LF.
                    self.last_ended_cr = out.len() > before && out.last() == Some(&b'\r');
                }
                Ok(None) => return Flow::Continue,
                Err(e) => return self.close(out, &e.to_string()),
            }
        }
    }

    /// Upstream ended: inspects an unterminated last event like any other, then closes the
    /// dialect state. Call once.
    pub(crate) fn finish(&mut self, out: &mut Output) {
        self.finish_events(out);
        self.backstop(out);
    }

    /// The second line (`backstop.rs`): the events a machine wrote since the last look are
    /// read again by call shape; one that presents a blocked call is dropped with everything
    /// after it, and the stream ends (fail closed) — an item the dialect's typed reading could
    /// not take must not pass unjudged. Runs are not read again: they hold no tool key.
    fn backstop(&mut self, out: &mut Output) -> bool {
        out.seal();
        while out.checked < out.ready.len() {
            let i = out.checked;
            out.checked += 1;
            if !out.machine_written[i] || !backstop::may_hold_a_call(&out.ready[i]) {
                continue;
            }
            let Some(found) = backstop::scan_sse(&out.ready[i], self.cx.gate.as_ref()) else {
                continue;
            };
            out.ready.truncate(i);
            out.machine_written.truncate(i);
            let why = format!(
                "a blocked tool call ({}) that the {} reading missed",
                found.name,
                self.cx.dialect.as_str()
            );
            self.cx
                .record(found.name, String::new(), None, found.decision);
            self.close(&mut out.written, &why);
            out.seal();
            out.checked = out.ready.len();
            return true;
        }
        false
    }

    fn finish_events(&mut self, out: &mut Output) {
        if self.closed {
            return;
        }
        let out = &mut out.written;
        let rest = self.decoder.finish();
        if !rest.is_empty() {
            tracing::debug!(bytes = rest.len(), "stream ended inside an event");
            let data = SseEvent::new(&rest).data();
            if let Err(fatal) = self.on_event(&rest, data, out) {
                self.close(out, &fatal.0);
                return;
            }
        }
        self.machine.get().on_end(&mut self.cx, out);
        self.closed = true;
    }

    /// One event to the dialect: its data trimmed, or as an event without data.
    fn on_event(
        &mut self,
        raw: &Bytes,
        data: Option<Cow<'_, [u8]>>,
        out: &mut BytesMut,
    ) -> Result<(), Fatal> {
        match data {
            Some(data) => self
                .machine
                .get()
                .on_data(&mut self.cx, raw, trim_ws(&data), out),
            None => self.machine.get().on_dataless(&mut self.cx, raw, out),
        }
    }

    fn close(&mut self, out: &mut BytesMut, why: &str) -> Flow {
        tracing::warn!(
            dialect = self.cx.dialect.as_str(),
            why,
            "ending the stream (fail closed)"
        );
        let machine = self.machine.get();
        machine.write_error(out, &format!("[toolwall] response stopped: {why}"));
        machine.on_end(&mut self.cx, &mut BytesMut::new());
        // Nothing more is framed: what the decoder holds (an event that may be megabytes) is
        // released now, not when the response body is dropped.
        self.decoder = SseDecoder::new(0);
        self.closed = true;
        Flow::Closed
    }

    /// Bytes this response holds now: its incomplete event and what its dialect machine holds
    /// back (the proxy counts them against its memory budget after each read). O(1).
    pub(crate) fn held_bytes(&self) -> usize {
        if self.closed {
            return 0;
        }
        self.decoder.buffered() + self.machine.held_bytes()
    }

    /// Ends the stream from outside (fail closed): the dialect's error event is written with
    /// `why`, exactly as for an event over the buffer limit, and what was held is dropped.
    pub(crate) fn stop(&mut self, out: &mut Output, why: &str) {
        if self.closed {
            return;
        }
        self.close(&mut out.written, why);
        out.seal();
        out.checked = out.ready.len();
    }

    /// Takes the decisions made so far (to emit them as soon as they are made).
    pub(crate) fn drain_records(&mut self) -> std::vec::Drain<'_, Record> {
        self.cx.records.drain(..)
    }
}
