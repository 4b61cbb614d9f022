//! Server-sent events: the one framer every layer reads streams with (`framer.rs`: the LLM
//! interceptor's byte-exact events, split where the SDKs split them, lone `\r` included), the
//! message view the MCP layer reads on top of it (`message.rs`), and the one writer
//! (`writer.rs`) — issue 18: four codecs that disagreed on a lone CR were four parser
//! differentials.

pub(crate) mod framer;
pub(crate) mod message;
pub(crate) mod writer;

pub(crate) use framer::{SseDecoder, SseEvent};
pub(crate) use writer::{write_event, write_with_data};
