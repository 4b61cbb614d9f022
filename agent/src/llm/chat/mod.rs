//! OpenAI Chat Completions streaming (the tool-call array filtered, chunking-proof and
//! modelled on the official SDKs' accumulators).
//!
//! # How the SDKs build calls from chunks
//!
//! Read from the official SDKs' stream helpers, verified against openai Python 2.x (and the
//! 3.54.0 pinned in `xtask/peers`: `lib/streaming/_deltas.py` `accumulate_delta`,
//! `lib/streaming/chat/_completions.py`) and openai TypeScript 6.49.0
//! (`lib/ChatCompletionStream.js` `#accumulateChatCompletion`, `#addChunk`):
//! - Calls are kept per choice, and a `tool_calls` entry's `index` is a **list position** in
//!   that choice's calls, in both. A new `id` on an index does not start a new call (Python
//!   appends the ids, TypeScript keeps the last). Python inserts an unknown index with
//!   `list.insert`, which appends when it is past the end, so upstream indices 0, 2, 1 land on
//!   positions 0, 1, 1; TypeScript makes a sparse array. Both helpers then read
//!   `tool_calls[index]` and crash on a gap (`IndexError`; "Cannot read properties of
//!   undefined (reading 'id')").
//! - Names: Python (the helper's `accumulate_delta`, and the plain chunk loop users write)
//!   **appends** every `function.name` fragment (`"ec"` + `"ho"` = `echo`, `"echo"` twice =
//!   `echoecho`); TypeScript **replaces** the name with each non-empty fragment (`"x"` then
//!   `"echo"` = `echo`). Arguments are appended by both.
//! - Both emit `tool_calls.function.arguments.done` for a call, with its name as accumulated
//!   after the whole chunk, when a chunk's entries switch to another index and when the choice
//!   finishes; clients that act on that event see those intermediate names.
//!
//! # What this machine does
//!
//! Each call is tracked by (choice index, upstream index) in maps (O(1) per entry), with both
//! name views: every fragment appended, and the last non-empty one (a suffix of the first).
//! The output is renumbered **densely** per choice: the kept calls get 0, 1, 2... in the order
//! they first appeared, in every chunk, so the SDKs' list positions are exactly toolwall's
//! calls and no call can alias another (an entry is rewritten only when its number changes).
//!
//! When a name is final: a later chunk may add a fragment to any call of a choice at any time
//! (upstream may go back to an earlier index), so a name cannot change any more only once its
//! choice has a `finish_reason` or the stream ends (`[DONE]`, or its end). A new index in the
//! choice proves nothing. So every event from the first one carrying a tool call entry is
//! **held** (whole, in order, text included) until no choice has an undecided call; then each
//! call is judged on every name an SDK shows for it (both views of its final name, and both
//! views after each chunk that switched away from it: the names of `arguments.done` events),
//! and it passes only if all of them are allowed. The held events are then released: verbatim
//! when nothing in them changes (an allowed stream with dense indices leaves byte-identical,
//! only later), otherwise with blocked entries removed, kept entries renumbered, the choice's
//! `content` carrying the explanations on its finishing chunk (or in a chunk of its own when the
//! stream ended without one) and `finish_reason` `tool_calls` turned into `stop` when every call
//! of the choice was blocked. A blocked call is never cut short and never leaves in part.
//!
//! Costs of that rule: tool-call chunks reach the client when their choice finishes, not as
//! they stream; what is held (events, names and ids, a fixed cost per call) is bounded by the
//! stream buffer limit (`max_stream_buffer_bytes`), past which the stream ends with an error
//! (fail closed). Arguments assembled to record an allowed MCP call are a copy of held bytes.
//!
//! After a choice's `finish_reason`, an entry for a blocked call is dropped; arguments, a new
//! call or a name fragment for an allowed call in a finished choice end the stream (its
//! decision has left already, on the arguments it had then).
//! Entries in `custom` objects (`"type":"custom"`) are judged the same way, as a name of their
//! own. The legacy single `function_call` is judged on every fragment; a blocked one, or one of
//! a tool argument rules judge (its arguments are not held), ends the stream (no replacement
//! protocol).

use std::borrow::Cow;
use std::sync::LazyLock;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::Keys;

mod body;
mod edit;
mod stream;

pub(super) use body::rewrite_body;
pub(crate) use stream::Chat;

/// The keys a tool call comes under (the legacy `function_call` too).
static TOOL_KEYS: LazyLock<Keys> =
    LazyLock::new(|| Keys::new(&["\"tool_calls\"", "\"function_call\""]));

#[derive(Deserialize)]
struct ChoiceView<'a> {
    #[serde(default)]
    index: u64,
    #[serde(default, borrow)]
    delta: Option<&'a RawValue>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct DeltaView<'a> {
    #[serde(default, borrow)]
    tool_calls: Option<Vec<&'a RawValue>>,
    /// The deprecated single `function_call` (the `functions` request parameter).
    #[serde(default, borrow)]
    function_call: Option<FunctionView<'a>>,
}

#[derive(Deserialize)]
pub(crate) struct CallView<'a> {
    #[serde(default)]
    pub index: u64,
    #[serde(default, borrow)]
    pub id: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub function: Option<FunctionView<'a>>,
    /// A custom tool call (`"type":"custom"`): free-form `input` instead of JSON arguments.
    #[serde(default, borrow)]
    pub custom: Option<CustomView<'a>>,
}

#[derive(Deserialize)]
pub(crate) struct CustomView<'a> {
    #[serde(default, borrow)]
    pub name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub input: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
pub(crate) struct FunctionView<'a> {
    #[serde(default, borrow)]
    pub name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    pub arguments: Option<Cow<'a, str>>,
}

#[cfg(test)]
pub(crate) mod tests;
