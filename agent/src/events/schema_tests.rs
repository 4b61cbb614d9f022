//! The stored schema is pinned to the store's `user_version`: a new event type, or a field
//! added to or removed from one, fails here until a migration raises the version
//! (`store/mod.rs`, `MIGRATIONS`) and the new shape is pinned under it. An older binary then
//! refuses the newer database with a clear message instead of meeting rows it cannot read.

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use super::*;
use crate::decision::ResultFinding;

/// Each stored type's field names.
type Shape = &'static [(&'static str, &'static [&'static str])];

/// Every stored shape, by the version that introduced it; the last is today's.
const PINNED: &[(u32, Shape)] = &[(
    3,
    &[
        (
            "mcp_tool_call_intercepted",
            &[
                "action",
                "dialect",
                "input",
                "policy_revision",
                "reason",
                "request_id",
                "server_addr",
                "server_id",
                "server_tool",
                "server_type",
                "session_id",
                "timestamp",
                "tool_call_id",
                "tool_hash",
                "tool_name",
            ],
        ),
        (
            "mcp_tool_called",
            &[
                "action",
                "input",
                "jsonrpc_id",
                "layer",
                "policy_revision",
                "reason",
                "server_id",
                "server_type",
                "session_id",
                "timestamp",
                "tool_name",
            ],
        ),
        (
            "mcp_network_connection",
            &[
                "action",
                "cgroup_id",
                "cmdline",
                "comm",
                "count",
                "exe",
                "family",
                "pid",
                "policy_revision",
                "ppid",
                "protocol",
                "remote_addr",
                "server_id",
                "server_type",
                "session_id",
                "since",
                "socket_cookie",
                "tid",
                "timestamp",
                "uid",
            ],
        ),
        (
            "mcp_tool_seen",
            &[
                "action",
                "policy_revision",
                "reason",
                "server_id",
                "server_type",
                "session_id",
                "timestamp",
                "tool_hash",
                "tool_name",
            ],
        ),
        (
            "mcp_tool_changed",
            &[
                "action",
                "new_hash",
                "old_hash",
                "policy_revision",
                "server_id",
                "session_id",
                "timestamp",
                "tool_name",
            ],
        ),
        (
            "kernel_alert",
            &[
                "action",
                "alert",
                "detail",
                "pid",
                "session_id",
                "timestamp",
            ],
        ),
        (
            "mcp_result_inspected",
            &[
                "action",
                "findings",
                "findings_total",
                "inspection",
                "jsonrpc_id",
                "layer",
                "policy_revision",
                "reason",
                "server_id",
                "server_type",
                "session_id",
                "timestamp",
                "tool_name",
            ],
        ),
        (
            "llm_route",
            &[
                "action",
                "provider",
                "reason",
                "request_id",
                "route",
                "session_id",
                "timestamp",
            ],
        ),
        (
            "result_finding",
            &[
                "action", "end", "in_key", "kind", "pointer", "rule", "start",
            ],
        ),
    ],
)];

/// A deserializer that records the field names a struct asks for, and nothing else.
struct Fields(Vec<&'static str>);

#[derive(Debug)]
struct Stop;
impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fields recorded")
    }
}
impl std::error::Error for Stop {}
impl de::Error for Stop {
    fn custom<T: std::fmt::Display>(_: T) -> Self {
        Stop
    }
}

impl<'de> Deserializer<'de> for &mut Fields {
    type Error = Stop;
    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
        Err(Stop)
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Stop> {
        self.0.extend(fields);
        Err(Stop)
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

fn fields_of<T: for<'de> Deserialize<'de>>() -> Vec<&'static str> {
    let mut fields = Fields(Vec::new());
    let _ = T::deserialize(&mut fields);
    let mut names = fields.0;
    names.sort_unstable();
    names
}

/// Today's stored shapes: every kind the layers write (an unreadable row is never written).
fn today() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        (
            "mcp_tool_call_intercepted",
            fields_of::<ToolCallIntercepted>(),
        ),
        ("mcp_tool_called", fields_of::<ToolCalled>()),
        ("mcp_network_connection", fields_of::<NetworkConnection>()),
        ("mcp_tool_seen", fields_of::<ToolSeen>()),
        ("mcp_tool_changed", fields_of::<ToolChanged>()),
        ("kernel_alert", fields_of::<KernelAlert>()),
        ("mcp_result_inspected", fields_of::<ResultInspected>()),
        ("llm_route", fields_of::<LlmRoute>()),
        ("result_finding", fields_of::<ResultFinding>()),
    ]
}

#[test]
fn the_stored_schema_changes_only_with_the_stores_version() {
    let kinds: Vec<&str> = today().iter().map(|(k, _)| *k).collect();
    for kind in Event::KINDS {
        assert!(
            kinds.contains(&kind),
            "{kind} is stored: pin its fields here"
        );
    }
    let (version, pinned) = PINNED.last().expect("a pinned shape");
    let supported = store::supported_version();
    let shown: String = today()
        .iter()
        .map(|(kind, fields)| format!("        ({kind:?}, &{fields:?}),\n"))
        .collect();
    let pinned: Vec<(&str, Vec<&str>)> = pinned
        .iter()
        .map(|(kind, fields)| {
            let mut fields = fields.to_vec();
            fields.sort_unstable();
            (*kind, fields)
        })
        .collect();
    assert!(
        pinned == today(),
        "the stored events' shape changed: add a migration to `MIGRATIONS` (events/store/mod.rs) \
         and pin today's shape under its version in PINNED:\n{shown}"
    );
    assert_eq!(
        *version, supported,
        "the shape pinned last is the store's version"
    );
    for pair in PINNED.windows(2) {
        assert!(pair[0].0 < pair[1].0, "each shape under a newer version");
    }
}
