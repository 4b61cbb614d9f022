//! Server-sent events: the one framer every layer reads streams with (`framer.rs`: the LLM
//! interceptor's byte-exact events, split where the SDKs split them, lone `\r` included), the
//! message view the MCP layer reads on top of it (`message.rs`), and the one writer
//! (`writer.rs`): codecs that disagree on a lone CR are parser differentials, each a way to
//! hide a message from one layer that another acts on.

pub(crate) mod framer;
pub(crate) mod message;
pub(crate) mod writer;

pub(crate) use framer::{SseDecoder, SseEvent};
pub(crate) use writer::{write_event, write_with_data};
