use super::*;
use crate::llm::Keys;
use crate::sse::writer::write_with_data;

fn decode_all(chunks: &[&[u8]]) -> (Vec<Vec<u8>>, Vec<u8>) {
    let mut d = SseDecoder::new(1 << 20);
    let mut events = Vec::new();
    for c in chunks {
        d.feed(Bytes::copy_from_slice(c));
        while let Some(ev) = d.next_event().expect("within limit") {
            events.push(ev.to_vec());
        }
    }
    (events, d.finish().to_vec())
}

fn assert_hints_agree(chunks: &[&[u8]]) {
    let mut d = SseDecoder::new(1 << 20);
    for c in chunks {
        d.feed(Bytes::copy_from_slice(c));
        while let Some(ev) = d.next_event().expect("within limit") {
            assert_eq!(d.last_data().data(&ev), SseEvent::new(&ev).data());
        }
    }
}

/// Data of every event, for every split of `input` into two and three reads.
fn data_at_every_split(input: &[u8]) -> Vec<Vec<Option<Vec<u8>>>> {
    let mut all = Vec::new();
    for i in 0..=input.len() {
        for j in i..=input.len() {
            let (events, rest) = decode_all(&[&input[..i], &input[i..j], &input[j..]]);
            assert_eq!(events.concat(), input[..input.len() - rest.len()].to_vec());
            assert_hints_agree(&[&input[..i], &input[i..j], &input[j..]]);
            all.push(
                events
                    .iter()
                    .filter(|e| e.as_slice() != b"\n")
                    .map(|e| SseEvent::new(e).data().map(|d| d.to_vec()))
                    .collect(),
            );
        }
    }
    all
}

#[test]
fn line_ends_and_splits() {
    type Case = (&'static [u8], &'static [Option<&'static [u8]>]);
    let cases: &[Case] = &[
        (b"data: a\n\ndata: b\n\n", &[Some(b"a"), Some(b"b")]),
        (b"data: a\r\n\r\ndata: b\r\n\r\n", &[Some(b"a"), Some(b"b")]),
        (b"data: a\r\rdata: b\r\r", &[Some(b"a"), Some(b"b")]),
        (b"data:a\n\n", &[Some(b"a")]),
        (b"data:  a\n\n", &[Some(b" a")]),
        (b"data: a\ndata: b\n\n", &[Some(b"a\nb")]),
        (b"event: x\n: comment\nid: 1\nfoo\ndata\n\n", &[Some(b"")]),
        (b": only a comment\n\n", &[None]),
        (b"data: a\r\ndata: b\rdata: c\n\n", &[Some(b"a\nb\nc")]),
    ];
    for (input, want) in cases {
        let want: Vec<Option<Vec<u8>>> = want.iter().map(|d| d.map(|d| d.to_vec())).collect();
        for got in data_at_every_split(input) {
            assert_eq!(got, want, "input {:?}", String::from_utf8_lossy(input));
        }
    }
}

#[test]
fn cr_then_lf_in_next_read_is_one_line_end() {
    // "data: a\r" | "\ndata: b\n\n": one event with two data lines, not an event "a".
    let (events, rest) = decode_all(&[b"data: a\r", b"\ndata: b\n\n"]);
    assert_eq!(events.len(), 1);
    assert_eq!(
        SseEvent::new(&events[0]).data().as_deref(),
        Some(&b"a\nb"[..])
    );
    assert!(rest.is_empty());
    // Blank line ended by a CR at the end of a read; the LF that follows belongs to it.
    let (events, _) = decode_all(&[b"data: a\r\n\r", b"\ndata: b\r\n\r\n"]);
    assert_eq!(events.len(), 3);
    assert_eq!(events[1], b"\n");
    assert_eq!(SseEvent::new(&events[1]).data(), None);
    assert_eq!(SseEvent::new(&events[2]).data().as_deref(), Some(&b"b"[..]));
}

#[test]
fn unterminated_last_event_is_returned_by_finish() {
    let (events, rest) = decode_all(&[b"data: a\n\ndata: b"]);
    assert_eq!(events.len(), 1);
    assert_eq!(rest, b"data: b");
}

#[test]
fn long_lines_have_no_cut_off_but_a_limit() {
    let long = vec![b'x'; 300 * 1024];
    let mut d = SseDecoder::new(1 << 20);
    d.feed(Bytes::from_static(b"data: "));
    d.feed(Bytes::copy_from_slice(&long));
    assert_eq!(d.next_event(), Ok(None));
    d.feed(Bytes::from_static(b"\n\n"));
    let ev = d.next_event().expect("ok").expect("complete");
    assert_eq!(SseEvent::new(&ev).data().map(|d| d.len()), Some(long.len()));

    let mut d = SseDecoder::new(1024);
    d.feed(Bytes::from_static(b"data: "));
    d.feed(Bytes::copy_from_slice(&long[..2000]));
    assert_eq!(d.next_event(), Err(SseError::TooLarge { limit: 1024 }));
}

/// Frames `chunks` as the interceptor does (a run whenever one is offered, else an event):
/// the runs and events in order, and what is left.
fn runs_and_events(chunks: &[&[u8]], keys: &Keys) -> (Vec<(bool, Vec<u8>)>, Vec<u8>) {
    let mut d = SseDecoder::new(1 << 20);
    let mut out = Vec::new();
    for c in chunks {
        d.feed(Bytes::copy_from_slice(c));
        loop {
            if let Some(run) = d.take_run(|b| keys.find(b)) {
                out.push((true, run.to_vec()));
            }
            match d.next_event().expect("within limit") {
                Some(ev) => out.push((false, ev.to_vec())),
                None => break,
            }
        }
    }
    (out, d.finish().to_vec())
}

#[test]
fn runs_are_whole_events_without_keys_at_every_split() {
    let keys = Keys::new(&["\"tool_use\""]);
    let inputs: [&[u8]; 4] = [
        b"data: a\n\n: c\n\ndata: \"tool_use\"\n\ndata: b\n\ndata: \\u0074\n\ndata: c\n\n",
        b"data: a\r\n\r\ndata: b\n\ndata: \"tool_use\"\r\rdata: c\n\n\n\ndata: d\r\n\n",
        b"data: a\r\rdata: b\n\rdata: \"tool_use\"\n\n",
        b"data: a\n\ndata: b\n\ndata: c",
    ];
    for input in inputs {
        let (whole, whole_rest) = decode_all(&[input]);
        for i in 0..=input.len() {
            for j in i..=input.len() {
                let (parts, rest) =
                    runs_and_events(&[&input[..i], &input[i..j], &input[j..]], &keys);
                assert_eq!(rest, whole_rest, "{i},{j}");
                let mut events = Vec::new();
                for (is_run, bytes) in &parts {
                    if *is_run {
                        assert!(keys.find(bytes).is_none(), "a key in a run at {i},{j}");
                        let (inner, left) = decode_all(&[bytes]);
                        assert!(left.is_empty(), "a run ends mid-event at {i},{j}");
                        events.extend(inner);
                    } else {
                        events.push(bytes.clone());
                    }
                }
                // The same bytes, and the same events but for the LF of a CRLF split
                // across reads, which comes out on its own.
                assert_eq!(events.concat(), whole.concat(), "at {i},{j}");
                let data = |evs: &[Vec<u8>]| -> Vec<Option<Vec<u8>>> {
                    evs.iter()
                        .filter(|e| e.as_slice() != b"\n")
                        .map(|e| SseEvent::new(e).data().map(|d| d.to_vec()))
                        .collect()
                };
                assert_eq!(
                    data(&events),
                    data(&whole),
                    "{:?} at {i},{j}",
                    String::from_utf8_lossy(input)
                );
            }
        }
    }
}

#[test]
fn runs_and_events_within_a_read_are_not_copied() {
    let keys = Keys::new(&["\"tool_use\""]);
    let read =
        Bytes::from_static(b"data: a\n\ndata: b\n\ndata: \"tool_use\"\n\ndata: c\n\ndata: d");
    let within = |b: &Bytes| {
        let (start, end) = (read.as_ptr() as usize, read.as_ptr() as usize + read.len());
        (start..end).contains(&(b.as_ptr() as usize))
    };
    let mut d = SseDecoder::new(1 << 20);
    d.feed(read.clone());
    let run = d.take_run(|b| keys.find(b)).expect("a run before the key");
    assert_eq!(&run[..], b"data: a\n\ndata: b\n\n");
    assert!(within(&run));
    let ev = d.next_event().expect("ok").expect("the event with the key");
    assert_eq!(&ev[..], b"data: \"tool_use\"\n\n");
    assert!(within(&ev));
    assert_eq!(
        &d.take_run(|b| keys.find(b)).expect("the rest")[..],
        b"data: c\n\n"
    );
    assert_eq!(d.next_event(), Ok(None));
    assert_eq!(d.buffered(), 7);
}

#[test]
fn event_type_and_rewrite_keep_other_lines() {
    let raw = b"event: message_delta\r\n: c\r\ndata: {\"a\":1}\r\nid: 7\r\n\r\n";
    let ev = SseEvent::new(raw);
    let event_field = ev.lines().find_map(|(line, _)| match line {
        Line::Field(b"event", v) => Some(v),
        _ => None,
    });
    assert_eq!(event_field, Some(&b"message_delta"[..]));
    let mut out = BytesMut::new();
    write_with_data(&mut out, raw, b"{\"a\":2}\n{}");
    assert_eq!(
        &out[..],
        b"event: message_delta\n: c\ndata: {\"a\":2}\ndata: {}\nid: 7\n\n"
    );
}
