//! What a response body is, told from its first bytes rather than its label: the SDKs parse a
//! JSON document as JSON whatever its content-type says.

use std::io;

use bytes::Bytes;
use futures_util::StreamExt;

use super::Reads;
use crate::llm::backstop;

/// The first reads of a body, up to its first byte that is not whitespace (or a byte order
/// mark), and whether that byte opens a JSON document.
pub(super) struct Peeked {
    pub(super) reads: Vec<Bytes>,
    pub(super) json: bool,
}

pub(super) async fn sniff(reads: &mut Reads, limit: usize) -> io::Result<Peeked> {
    let mut peeked = Peeked {
        reads: Vec::new(),
        json: true,
    };
    // Only whitespace (and a byte order mark) is kept here: the first other byte decides.
    let mut prefix = Vec::new();
    while let Some(read) = reads.next().await {
        let read = read?;
        // Up to the first byte that is neither whitespace nor part of a byte order mark.
        let upto = read
            .iter()
            .position(|b| !b.is_ascii_whitespace() && !matches!(b, 0xEF | 0xBB | 0xBF))
            .map_or(read.len(), |i| i + 1);
        prefix.extend_from_slice(&read[..upto]);
        peeked.reads.push(read);
        if let Some(json) = backstop::opens_json(&prefix) {
            peeked.json = json;
            return Ok(peeked);
        }
        if prefix.len() > limit {
            break;
        }
    }
    // Empty or only whitespace: a (trivially) whole body.
    Ok(peeked)
}
