//! Deciding complete tool items: function calls, hosted MCP approval requests, and custom tool
//! calls with every MCP tool their code references.

use std::sync::LazyLock;

use super::{Item, display_name};
use crate::llm::{Cx, blocked_message};

/// Decides a complete item (buffered bodies, or an item seen only at `done`): the replacement
/// text and the item id when it must be blocked. Records what it decides.
pub(crate) fn judge_item(cx: &mut Cx, item: &Item<'_>, record: bool) -> Option<(String, String)> {
    let id = item.id.as_deref().unwrap_or_default().to_owned();
    let call_id = item.call_id.as_deref().unwrap_or(&id).to_owned();
    match item.ty.as_ref() {
        "function_call" => {
            let name = item.name.as_deref().unwrap_or_default();
            let ns = item.namespace.as_deref();
            let decision = cx.check_complete(name, ns, item.arguments.as_deref());
            let shown = display_name(name, ns);
            let input = item
                .arguments
                .as_deref()
                .and_then(|a| serde_json::from_str(a).ok());
            if decision.is_blocked() {
                let text = blocked_message(&shown, &decision.reason);
                if record {
                    cx.record(shown, call_id, input, decision);
                }
                Some((text, id))
            } else {
                if record {
                    cx.record(shown, call_id, input, decision);
                }
                None
            }
        }
        "mcp_approval_request" => {
            let (shown, _) = item.call_name();
            let shown = shown.into_owned();
            let decision = cx.check_complete(&shown, None, item.arguments.as_deref());
            let blocked = decision.is_blocked();
            crate::llm::request::note_approval_request(
                &id,
                item.server_label.as_deref().unwrap_or_default(),
                item.name.as_deref().unwrap_or_default(),
                blocked,
            );
            let text = blocked.then(|| blocked_message(&shown, &decision.reason));
            if record {
                let input = item
                    .arguments
                    .as_deref()
                    .and_then(|a| serde_json::from_str(a).ok());
                cx.record(shown, id.clone(), input, decision);
            }
            text.map(|t| (t, id))
        }
        "custom_tool_call" => {
            let name = item.name.as_deref().unwrap_or_default();
            let input = item.input.as_deref().unwrap_or_default();
            judge_custom(cx, name, &call_id, input).map(|t| (t, id))
        }
        _ => None,
    }
}

/// Decides a custom tool call (Codex code mode): the call itself and every MCP tool its code
/// references. Returns the replacement text when one of them is blocked.
pub(super) fn judge_custom(cx: &mut Cx, name: &str, call_id: &str, input: &str) -> Option<String> {
    let mut blocked: Option<String> = None;
    let own = cx.check(name, None);
    if own.is_blocked() {
        blocked = Some(blocked_message(name, &own.reason));
    }
    let code = serde_json::Value::String(input.to_owned());
    cx.record(name.to_owned(), call_id.to_owned(), Some(code.clone()), own);
    let normalised = normalise_code(input);
    let mut refs: Vec<(&str, &str)> = mcp_references(input);
    for r in mcp_references(&normalised) {
        if !refs.contains(&r) {
            refs.push(r);
        }
    }
    for (server, tool) in refs {
        let namespace = format!("mcp__{server}");
        let decision = cx.check(tool, Some(&namespace));
        let shown = display_name(tool, Some(&namespace));
        if decision.is_blocked() && blocked.is_none() {
            blocked = Some(blocked_message(&shown, &decision.reason));
        }
        cx.record(shown, call_id.to_owned(), Some(code.clone()), decision);
    }
    blocked
}

/// The spellings of a name that code can use and this layer can undo, undone (a scan for the
/// literal name misses them): `\uXXXX`, `\u{X…}` and `\xNN` escapes (in JavaScript identifiers and
/// strings) decoded, and string literals joined by `+` merged (`"mcp__s__ec" + 'ho'`, which bracket
/// access `tools["…" + "…"]` uses). Arbitrary code (names computed at run time, template
/// substitutions, `String.fromCharCode`) cannot be decided here: the MCP layer decides those calls
/// when they run (README, "What the LLM layer cannot decide").
pub(crate) fn normalise_code(code: &str) -> String {
    static ESCAPE: LazyLock<regex::Regex> = LazyLock::new(|| {
        regex::Regex::new(r"\\u\{([0-9a-fA-F]{1,6})\}|\\u([0-9a-fA-F]{4})|\\x([0-9a-fA-F]{2})")
            .expect("a valid pattern")
    });
    static JOIN: LazyLock<regex::Regex> =
        LazyLock::new(|| regex::Regex::new(r#"["'`]\s*\+\s*["'`]"#).expect("a valid pattern"));
    let decoded = ESCAPE.replace_all(code, |c: &regex::Captures<'_>| {
        let hex = c
            .get(1)
            .or(c.get(2))
            .or(c.get(3))
            .map_or("", |m| m.as_str());
        u32::from_str_radix(hex, 16)
            .ok()
            .and_then(char::from_u32)
            .map_or_else(|| c[0].to_owned(), String::from)
    });
    JOIN.replace_all(&decoded, "").into_owned()
}

/// Every `mcp__<server>__<tool>` identifier in `code` (deduplicated, in order). Any mention
/// counts, not only `tools.x(` calls: aliasing a tool before calling it must not hide it.
pub(crate) fn mcp_references(code: &str) -> Vec<(&str, &str)> {
    let mut refs: Vec<(&str, &str)> = Vec::new();
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$' || c == '-';
    for (start, _) in code.match_indices("mcp__") {
        let rest = &code[start + 5..];
        let end = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
        let ident = &rest[..end];
        if let Some((server, tool)) = ident.split_once("__")
            && !server.is_empty()
            && !tool.is_empty()
            && !refs.contains(&(server, tool))
        {
            refs.push((server, tool));
        }
    }
    refs
}
