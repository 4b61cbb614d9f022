//! HTTP/1.1 chunked transfer coding (RFC 9112 §7.1), decoded in place: the chunk data of a
//! read is moved together over the framing between it, so a read holding hundreds of one-event
//! chunks leaves as one slice of the read buffer (no allocation, one `memmove` per chunk after
//! the first; the first, often the only one of a large chunk, is not moved at all).
//!
//! Strict where the RFC lets a recipient choose: CRLF line ends only, no whitespace but SP/HTAB
//! after the size, sizes and lines bounded. Anything else is an error, and the stream breaks
//! (the proxy never guesses where a chunk ends).

use bytes::{Buf, Bytes, BytesMut};

/// Longest chunk-size line (size, extensions) accepted.
const MAX_LINE: usize = 4096;
/// Most trailer bytes accepted after the last chunk (they are read and dropped).
const MAX_TRAILERS: usize = 16 * 1024;

/// Why a chunked body cannot be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum ChunkError {
    #[error("invalid chunk size line")]
    Size,
    #[error("chunk size line over {MAX_LINE} bytes")]
    LongLine,
    #[error("chunk data not followed by CRLF")]
    DataEnd,
    #[error("invalid or oversized trailer section")]
    Trailer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading hex digits of a size.
    Size {
        value: u64,
        digits: u8,
        line: usize,
    },
    /// Whitespace after the size.
    SizeWs {
        value: u64,
        line: usize,
    },
    /// A chunk extension (ignored) up to CR.
    Ext {
        value: u64,
        line: usize,
    },
    /// CR seen at the end of a size line.
    SizeLf {
        value: u64,
    },
    /// This many data bytes to go.
    Data(u64),
    DataCr,
    DataLf,
    /// Inside the trailer section: bytes of the current line, bytes so far.
    Trailer {
        line: usize,
        total: usize,
    },
    TrailerLf {
        empty: bool,
        total: usize,
    },
    Done,
}

/// The decoder's state between reads.
#[derive(Debug)]
pub(crate) struct Chunked {
    state: State,
    /// A framing error found after data that was handed out first.
    fault: Option<ChunkError>,
}

impl Default for Chunked {
    fn default() -> Self {
        Chunked {
            state: State::Size {
                value: 0,
                digits: 0,
                line: 0,
            },
            fault: None,
        }
    }
}

impl Chunked {
    /// The last chunk and the trailer section were read.
    pub(crate) fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Decodes what `raw` holds: returns the chunk data found (possibly empty) and leaves in
    /// `raw` only the bytes after the body (when done) or after the last byte understood.
    pub(crate) fn decode(&mut self, raw: &mut BytesMut) -> Result<Bytes, ChunkError> {
        if let Some(fault) = self.fault.take() {
            return Err(fault);
        }
        let (mut read, mut write) = (0usize, 0usize);
        let mut len = raw.len();
        while read < len && self.state != State::Done {
            if let State::Data(rest) = self.state {
                if write == 0 && read > 0 {
                    // Nothing decoded yet: drop the framing before this data instead of moving
                    // the data over it (a large chunk then leaves uncopied).
                    raw.advance(read);
                    len -= read;
                    read = 0;
                }
                let n = usize::try_from(rest).unwrap_or(usize::MAX).min(len - read);
                if read != write {
                    raw.copy_within(read..read + n, write);
                }
                read += n;
                write += n;
                let rest = rest - n as u64;
                self.state = if rest == 0 {
                    State::DataCr
                } else {
                    State::Data(rest)
                };
                continue;
            }
            match step(self.state, raw[read]) {
                Ok(next) => self.state = next,
                // The data before the fault is handed out first; the fault on the next call.
                Err(e) if write > 0 => {
                    self.fault = Some(e);
                    break;
                }
                Err(e) => return Err(e),
            }
            read += 1;
        }
        let data = raw.split_to(write).freeze();
        raw.advance(read - write);
        Ok(data)
    }
}

fn hex(b: u8) -> Option<u64> {
    match b {
        b'0'..=b'9' => Some(u64::from(b - b'0')),
        b'a'..=b'f' => Some(u64::from(b - b'a' + 10)),
        b'A'..=b'F' => Some(u64::from(b - b'A' + 10)),
        _ => None,
    }
}

/// One framing byte.
fn step(state: State, b: u8) -> Result<State, ChunkError> {
    let line_ok = |line: usize| {
        if line >= MAX_LINE {
            Err(ChunkError::LongLine)
        } else {
            Ok(line + 1)
        }
    };
    Ok(match state {
        State::Size {
            value,
            digits,
            line,
        } => {
            let line = line_ok(line)?;
            match (hex(b), b) {
                (Some(d), _) => {
                    // 16 hex digits would overflow; no body is that large anyway.
                    if digits >= 15 {
                        return Err(ChunkError::Size);
                    }
                    State::Size {
                        value: (value << 4) | d,
                        digits: digits + 1,
                        line,
                    }
                }
                _ if digits == 0 => return Err(ChunkError::Size),
                (None, b' ' | b'\t') => State::SizeWs { value, line },
                (None, b';') => State::Ext { value, line },
                (None, b'\r') => State::SizeLf { value },
                _ => return Err(ChunkError::Size),
            }
        }
        State::SizeWs { value, line } => {
            let line = line_ok(line)?;
            match b {
                b' ' | b'\t' => State::SizeWs { value, line },
                b';' => State::Ext { value, line },
                b'\r' => State::SizeLf { value },
                _ => return Err(ChunkError::Size),
            }
        }
        State::Ext { value, line } => {
            let line = line_ok(line)?;
            match b {
                b'\r' => State::SizeLf { value },
                b'\n' => return Err(ChunkError::Size),
                _ => State::Ext { value, line },
            }
        }
        State::SizeLf { value } => match b {
            b'\n' if value == 0 => State::Trailer { line: 0, total: 0 },
            b'\n' => State::Data(value),
            _ => return Err(ChunkError::Size),
        },
        State::DataCr => match b {
            b'\r' => State::DataLf,
            _ => return Err(ChunkError::DataEnd),
        },
        State::DataLf => match b {
            b'\n' => State::Size {
                value: 0,
                digits: 0,
                line: 0,
            },
            _ => return Err(ChunkError::DataEnd),
        },
        State::Trailer { line, total } => {
            if total >= MAX_TRAILERS {
                return Err(ChunkError::Trailer);
            }
            match b {
                b'\r' => State::TrailerLf {
                    empty: line == 0,
                    total: total + 1,
                },
                b'\n' => return Err(ChunkError::Trailer),
                _ => State::Trailer {
                    line: line + 1,
                    total: total + 1,
                },
            }
        }
        State::TrailerLf { empty, total } => match b {
            b'\n' if empty => State::Done,
            b'\n' => State::Trailer {
                line: 0,
                total: total + 1,
            },
            _ => return Err(ChunkError::Trailer),
        },
        State::Data(_) | State::Done => state,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `wire` fed in the given pieces; the data, and the bytes left after the body.
    fn decode_in(pieces: &[&[u8]]) -> Result<(Vec<u8>, Vec<u8>, bool), ChunkError> {
        let mut dec = Chunked::default();
        let mut raw = BytesMut::new();
        let mut data = Vec::new();
        for piece in pieces {
            raw.extend_from_slice(piece);
            data.extend_from_slice(&dec.decode(&mut raw)?);
        }
        // Once more with nothing new: a fault found after data surfaces now.
        data.extend_from_slice(&dec.decode(&mut raw)?);
        Ok((data, raw.to_vec(), dec.is_done()))
    }

    const WIRE: &[u8] = b"5\r\nhello\r\n1;ext=\"a;b\"\r\n \r\n10 \t\r\n0123456789abcdef\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";

    #[test]
    fn decodes_at_every_split_into_two_and_three_reads() {
        let want = b"hello 0123456789abcdef".to_vec();
        for i in 0..=WIRE.len() {
            let got = decode_in(&[&WIRE[..i], &WIRE[i..]]).expect("valid");
            assert_eq!(got, (want.clone(), b"NEXT".to_vec(), true), "split at {i}");
            for j in i..=WIRE.len() {
                let got = decode_in(&[&WIRE[..i], &WIRE[i..j], &WIRE[j..]]).expect("valid");
                assert_eq!(got.0, want, "splits at {i}, {j}");
                assert!(got.2);
            }
        }
    }

    #[test]
    fn many_chunks_in_one_read_are_one_slice_of_it() {
        let mut raw = BytesMut::new();
        for _ in 0..300 {
            raw.extend_from_slice(b"b\r\ndata: xy\n\n\n\r\n");
        }
        let start = raw.as_ptr();
        let data = Chunked::default().decode(&mut raw).expect("valid");
        assert_eq!(data.len(), 300 * 11);
        assert_eq!(data.as_ptr(), start.wrapping_add(3), "decoded in place");
        assert!(raw.is_empty());
    }

    #[test]
    fn a_lone_large_chunk_is_not_moved() {
        let mut raw = BytesMut::from(&b"4000\r\n"[..]);
        raw.extend_from_slice(&[b'x'; 0x4000]);
        raw.extend_from_slice(b"\r\n");
        let start = raw.as_ptr();
        let data = Chunked::default().decode(&mut raw).expect("valid");
        assert_eq!(data.len(), 0x4000);
        assert_eq!(data.as_ptr(), start.wrapping_add(6));
    }

    #[test]
    fn malformed_framing_is_refused() {
        for (wire, err) in [
            (&b"\r\n"[..], ChunkError::Size),
            (b"g\r\n", ChunkError::Size),
            (b"5\nhello\r\n", ChunkError::Size),
            (b"5\r\nhelloX", ChunkError::DataEnd),
            (b"5\r\nhello\r\r", ChunkError::DataEnd),
            (b"1000000000000000\r\n", ChunkError::Size),
            (b"0\r\nbad\n", ChunkError::Trailer),
        ] {
            assert_eq!(decode_in(&[wire]).map(|_| ()), Err(err), "{wire:?}");
        }
        let long = [b"1;".to_vec(), vec![b'x'; MAX_LINE]].concat();
        assert_eq!(decode_in(&[&long]).map(|_| ()), Err(ChunkError::LongLine));
        let trailers = [b"0\r\n".to_vec(), b"a: b\r\n".repeat(MAX_TRAILERS / 6 + 1)].concat();
        assert_eq!(
            decode_in(&[&trailers]).map(|_| ()),
            Err(ChunkError::Trailer)
        );
    }

    #[test]
    fn data_before_a_fault_is_handed_out_first() {
        let mut dec = Chunked::default();
        let mut raw = BytesMut::from(&b"2\r\nok\r\nzz\r\n"[..]);
        assert_eq!(&dec.decode(&mut raw).expect("the data first")[..], b"ok");
        assert_eq!(dec.decode(&mut raw), Err(ChunkError::Size));
    }

    #[test]
    fn an_unfinished_body_is_not_done() {
        let (data, rest, done) = decode_in(&[b"5\r\nhel"]).expect("valid so far");
        assert_eq!((data, rest, done), (b"hel".to_vec(), vec![], false));
    }
}
