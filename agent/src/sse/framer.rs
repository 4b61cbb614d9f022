//! The one server-sent events framer (WHATWG "event stream" rules), sans-IO.
//!
//! The interceptors must see every event whole, whatever the TCP reads looked like, and must
//! forward the events they do not change byte for byte. So the decoder (mini-redis style) takes
//! each read as [`Bytes`] and hands out each complete event as the exact bytes it came in as: a
//! slice of the read when the event lies within it (no copy), or the event assembled in its own
//! [`BytesMut`] when it spans reads; an [`SseEvent`] view then finds the fields on demand.
//!
//! Line ends are LF, CR or CRLF. A CR that ends one read may be the first half of a CRLF whose LF
//! starts the next read; the decoder remembers that and does not count the LF as a second (empty)
//! line, which would otherwise split an event in two at the wrong place.

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};

/// Why a stream cannot be framed any further.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SseError {
    /// One event grew past the per-stream memory limit before it was complete. The event is never
    /// passed on uninspected: the caller ends the stream.
    #[error("an SSE event exceeded the {limit}-byte buffer limit before it was complete")]
    TooLarge {
        /// The configured limit.
        limit: usize,
    },
}

/// Incremental SSE event splitter.
///
/// `feed` each read as it arrives, then call [`SseDecoder::next_event`] until it returns
/// `Ok(None)` ("incomplete" is the normal state, not an error). At end of input,
/// [`SseDecoder::finish`] returns what is left (an unterminated last event), so the caller can
/// inspect it too.
///
/// An event wholly inside one read comes out as a slice of that read (shared, not copied); only
/// an event that spans reads is copied, into `carry`. [`SseDecoder::take_run`] hands out a whole
/// run of events at once, for a caller that knows none of them needs looking at.
#[derive(Debug)]
pub struct SseDecoder {
    /// The start of an event that began in an earlier read. While it is not empty it is the
    /// buffer being framed (and the read it continues into has been appended up to a point
    /// where an event must end, see [`SseDecoder::feed`]).
    carry: BytesMut,
    /// The read being framed; `input[pos..]` is the buffer when `carry` is empty.
    input: Bytes,
    pos: usize,
    /// Bytes of the buffer already scanned for line ends (never rescanned: framing is O(n)).
    scanned: usize,
    /// Start of the line being scanned.
    line_start: usize,
    /// The last line end seen was a CR at the very end of the input so far: an LF next is its
    /// second half, not a line of its own.
    after_cr: bool,
    /// The event last returned is the LF completing the previous event's final CRLF.
    crlf_tail: bool,
    /// Data lines seen in the event being scanned.
    data: DataHint,
    /// Data lines of the event last returned.
    last_data: DataHint,
    /// Where [`SseDecoder::take_run`] looked last in `input`, so a run's keys are searched once.
    run: Option<RunScan>,
    limit: usize,
}

/// What one search of `input` for a run found (positions in `input`).
#[derive(Debug, Clone, Copy)]
struct RunScan {
    /// The first key at or after where the search began (`input.len()` if none).
    key: usize,
    /// The end of the last `\n\n` before `key` (0 if none): the run may go up to here.
    end: usize,
}

impl SseDecoder {
    /// A decoder that buffers at most `limit` bytes of one incomplete event.
    pub fn new(limit: usize) -> Self {
        SseDecoder {
            carry: BytesMut::new(),
            input: Bytes::new(),
            pos: 0,
            scanned: 0,
            line_start: 0,
            after_cr: false,
            crlf_tail: false,
            data: DataHint::None,
            last_data: DataHint::None,
            run: None,
            limit,
        }
    }

    /// Takes the next read from the stream.
    ///
    /// While an event is open in `carry`, the read is appended to it only up to its first
    /// `\n\n` (a blank line: every event open before it has ended there), so the events after
    /// that are framed in place, uncopied.
    pub fn feed(&mut self, input: Bytes) {
        if self.pos < self.input.len() {
            // Not drained: what is left joins the open event (offsets stay as they are: the
            // buffer still starts where it did).
            self.carry.extend_from_slice(&self.input[self.pos..]);
        }
        self.run = None;
        let cut = if self.carry.is_empty() {
            0
        } else if self.carry.last() == Some(&b'\n') && input.first() == Some(&b'\n') {
            1
        } else {
            memchr::memmem::find(&input, b"\n\n").map_or(input.len(), |p| p + 2)
        };
        self.carry.extend_from_slice(&input[..cut]);
        self.input = input;
        self.pos = cut;
    }

    /// The bytes being framed: the open event's start and what follows it.
    fn buf(&self) -> &[u8] {
        if self.carry.is_empty() {
            &self.input[self.pos..]
        } else {
            &self.carry
        }
    }

    /// Hands out the first `end` bytes of the buffer as an event.
    fn take(&mut self, end: usize) -> Bytes {
        self.scanned = 0;
        self.line_start = 0;
        if self.carry.is_empty() {
            let raw = self.input.slice(self.pos..self.pos + end);
            self.pos += end;
            raw
        } else {
            self.carry.split_to(end).freeze()
        }
    }

    /// The next complete event (its raw bytes, up to and including the blank line that ends it),
    /// `Ok(None)` when more input is needed, or an error when the pending event is over the limit.
    /// A lone `\n` completing a CRLF split across reads comes out as its own "event" (no fields).
    pub fn next_event(&mut self) -> Result<Option<Bytes>, SseError> {
        self.crlf_tail = false;
        loop {
            if self.after_cr {
                let Some(&b) = self.buf().get(self.scanned) else {
                    return self.incomplete();
                };
                self.after_cr = false;
                if b == b'\n' {
                    if self.scanned == 0 {
                        // The LF half of the CRLF that ended the event just dispatched: hand it
                        // out on its own so it is forwarded even if the next event is rewritten.
                        self.crlf_tail = true;
                        self.last_data = DataHint::None;
                        return Ok(Some(self.take(1)));
                    }
                    self.scanned += 1;
                    self.line_start = self.scanned;
                }
            }
            let buf = self.buf();
            let Some(off) = memchr::memchr2(b'\r', b'\n', &buf[self.scanned..]) else {
                self.scanned = buf.len();
                return self.incomplete();
            };
            let i = self.scanned + off;
            let blank = i == self.line_start;
            let end = if buf[i] == b'\n' {
                i + 1
            } else if i + 1 < buf.len() {
                if buf[i + 1] == b'\n' { i + 2 } else { i + 1 }
            } else {
                // A CR at the end of what we have: the line has ended, but an LF may follow.
                self.after_cr = true;
                i + 1
            };
            if !blank {
                self.note_line(self.line_start, i);
            }
            self.scanned = end;
            self.line_start = end;
            if blank {
                self.last_data = std::mem::take(&mut self.data);
                return Ok(Some(self.take(end)));
            }
        }
    }

    /// A run of whole events, from the next one up to the last `\n\n` before the first place
    /// `find` points at (over the run's raw bytes, all fields; the LLM layer finds its dialect's
    /// tool keys, `llm/keys.rs`), handed out as one slice, unframed; `None`
    /// when there is none (mid-event, or a match in the next event). Each byte is searched
    /// once per read: what was found is kept until the events around it have been taken.
    pub fn take_run(&mut self, find: impl Fn(&[u8]) -> Option<usize>) -> Option<Bytes> {
        if !self.carry.is_empty() || self.after_cr || self.scanned != 0 {
            return None;
        }
        // A kept scan only ever answers "no run" (the run it found was taken when it was made,
        // and `pos` only grows), so a key set that changed since cannot widen a run.
        let scan = match self.run {
            Some(scan) if self.pos <= scan.key => scan,
            _ => {
                let rest = &self.input[self.pos..];
                let key = find(rest).map_or(self.input.len(), |k| self.pos + k);
                let end = memchr::memmem::rfind(&self.input[self.pos..key], b"\n\n")
                    .map_or(0, |p| self.pos + p + 2);
                let scan = RunScan { key, end };
                self.run = Some(scan);
                scan
            }
        };
        if scan.end <= self.pos {
            return None;
        }
        let run = self.input.slice(self.pos..scan.end);
        self.pos = scan.end;
        self.last_data = DataHint::None;
        Some(run)
    }

    /// Notes where a `data:` line's value is, so the common one-line event needs no second
    /// pass to find its data.
    fn note_line(&mut self, start: usize, end: usize) {
        let buf = self.buf();
        let line = &buf[start..end];
        if !line.starts_with(b"data") || (line.len() > 4 && line[4] != b':') {
            return;
        }
        let mut from = start + line.len().min(5);
        if buf.get(from) == Some(&b' ') && from < end {
            from += 1;
        }
        self.data = match self.data {
            DataHint::None => DataHint::Single(from..end),
            _ => DataHint::Multi,
        };
    }

    /// Where the data of the event last returned is (valid for that event's bytes).
    pub fn last_data(&self) -> &DataHint {
        &self.last_data
    }

    fn incomplete(&mut self) -> Result<Option<Bytes>, SseError> {
        if self.carry.is_empty() && self.pos < self.input.len() {
            // The read ended inside an event: keep its start for the next read (the buffer
            // starts at the same byte, so the scan offsets hold).
            self.carry.extend_from_slice(&self.input[self.pos..]);
            self.pos = self.input.len();
        }
        if self.carry.len() > self.limit {
            Err(SseError::TooLarge { limit: self.limit })
        } else {
            Ok(None)
        }
    }

    /// Takes whatever is buffered at end of input: an event that was never terminated by a blank
    /// line (empty if the stream ended cleanly).
    pub fn finish(&mut self) -> Bytes {
        self.data = DataHint::None;
        self.last_data = DataHint::Multi;
        self.scanned = 0;
        self.line_start = 0;
        self.after_cr = false;
        self.run = None;
        let rest = self.input.slice(self.pos..);
        self.pos = self.input.len();
        if self.carry.is_empty() {
            rest
        } else {
            self.carry.extend_from_slice(&rest);
            self.carry.split().freeze()
        }
    }

    /// Whether the event last returned is only the LF completing the CRLF that ended the one
    /// before (forward it only if that event was forwarded verbatim).
    pub fn is_crlf_tail(&self) -> bool {
        self.crlf_tail
    }

    /// Bytes held for an incomplete event.
    pub fn buffered(&self) -> usize {
        self.carry.len() + self.input.len() - self.pos
    }
}

/// Where an event's data is, as found while framing it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DataHint {
    /// No `data:` line.
    #[default]
    None,
    /// Exactly one `data:` line; its value is this range of the event's bytes.
    Single(std::ops::Range<usize>),
    /// Several `data:` lines (or unknown): join them with [`SseEvent::data`].
    Multi,
}

impl DataHint {
    /// The data of `raw` (the event this hint is for).
    pub fn data<'a>(&self, raw: &'a [u8]) -> Option<Cow<'a, [u8]>> {
        match self {
            DataHint::None => None,
            DataHint::Single(r) => raw.get(r.clone()).map(Cow::Borrowed),
            DataHint::Multi => SseEvent::new(raw).data(),
        }
    }
}

/// One line of an event: a field (name and value, the single leading space of the value
/// removed) or a comment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Line<'a> {
    /// `name: value`, or `name` alone (empty value).
    Field(&'a [u8], &'a [u8]),
    /// `: anything`, kept verbatim.
    Comment(&'a [u8]),
}

/// Iterates the lines of a raw event, each with its own bytes (line end excluded).
#[derive(Debug, Clone)]
pub(crate) struct Lines<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Lines<'a> {
    /// The parsed line and its raw text.
    type Item = (Line<'a>, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.rest.is_empty() {
                return None;
            }
            let (line, next) = match memchr::memchr2(b'\r', b'\n', self.rest) {
                Some(i) => {
                    let skip = if self.rest[i] == b'\r' && self.rest.get(i + 1) == Some(&b'\n') {
                        2
                    } else {
                        1
                    };
                    (&self.rest[..i], i + skip)
                }
                None => (self.rest, self.rest.len()),
            };
            self.rest = &self.rest[next..];
            if line.is_empty() {
                // The terminating blank line (or the LF half of a CRLF split across reads).
                continue;
            }
            let parsed = match memchr::memchr(b':', line) {
                Some(0) => Line::Comment(&line[1..]),
                Some(c) => {
                    let value = &line[c + 1..];
                    Line::Field(&line[..c], value.strip_prefix(b" ").unwrap_or(value))
                }
                None => Line::Field(line, b""),
            };
            return Some((parsed, line));
        }
    }
}

/// A view over one raw event.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SseEvent<'a> {
    raw: &'a [u8],
}

impl<'a> SseEvent<'a> {
    /// Views raw event bytes as produced by [`SseDecoder`].
    pub(crate) fn new(raw: &'a [u8]) -> Self {
        SseEvent { raw }
    }

    /// Lines of the event, in order.
    pub(crate) fn lines(&self) -> Lines<'a> {
        Lines { rest: self.raw }
    }

    /// The event type as a client's parser reads it: the last `event:` field (`None`: none,
    /// which the SDKs treat as a `message` they skip).
    pub(crate) fn name(&self) -> Option<&'a [u8]> {
        self.lines().fold(None, |name, (line, _)| match line {
            Line::Field(b"event", v) => Some(v),
            _ => name,
        })
    }

    /// The data buffer: `data:` values joined by `\n`; borrowed when there is a single `data:`
    /// line (the common case, no allocation), `None` when the event has no data field.
    pub(crate) fn data(&self) -> Option<Cow<'a, [u8]>> {
        let mut data: Option<Cow<'a, [u8]>> = None;
        for (line, _) in self.lines() {
            if let Line::Field(b"data", v) = line {
                data = Some(match data {
                    None => Cow::Borrowed(v),
                    Some(prev) => {
                        let mut owned = prev.into_owned();
                        owned.push(b'\n');
                        owned.extend_from_slice(v);
                        Cow::Owned(owned)
                    }
                });
            }
        }
        data
    }
}

#[cfg(test)]
mod tests;
