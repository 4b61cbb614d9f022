//! Where a request says each provider-hosted MCP server is: its definitions' labels and URLs.
//!
//! The label is the agent's own name for a server the provider connects to. A hosted call's
//! result is taken for a declared server's tool (and gets its exemptions) only when its label
//! is that server's id and the request defines the label at the server's declared URL
//! (`mod.rs`, `judge`): a label `files` at another URL is another server, whatever its name.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use serde_json::Value;

/// Label → URL of every hosted MCP server `request` defines: OpenAI `tools[]` entries of type
/// `mcp` (namespaces' inner tools and `tool_search_output` items' tools included) and Anthropic
/// `mcp_servers[]`. A label defined without a URL (an OpenAI connector) or at two URLs that
/// are not one server's maps to `None`.
pub(super) fn hosted_urls(request: &Value) -> HashMap<String, Option<String>> {
    let mut found = HashMap::new();
    in_tools(&mut found, array(request, "tools"));
    for item in array(request, "input") {
        if item.get("type").and_then(Value::as_str) == Some("tool_search_output") {
            in_tools(&mut found, array(item, "tools"));
        }
    }
    for server in array(request, "mcp_servers") {
        add(&mut found, text(server, "name"), server.get("url"));
    }
    found
}

/// The array at `key`, empty when there is none.
fn array<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn in_tools(found: &mut HashMap<String, Option<String>>, tools: &[Value]) {
    for tool in tools {
        match tool.get("type").and_then(Value::as_str) {
            Some("mcp") => add(found, text(tool, "server_label"), tool.get("server_url")),
            _ => {
                if let Some(inner) = tool.get("tools").and_then(Value::as_array) {
                    in_tools(found, inner);
                }
            }
        }
    }
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn add(found: &mut HashMap<String, Option<String>>, label: &str, url: Option<&Value>) {
    if label.is_empty() {
        return;
    }
    let url = url.and_then(Value::as_str).map(str::to_owned);
    match found.entry(label.to_owned()) {
        Entry::Vacant(slot) => {
            slot.insert(url);
        }
        Entry::Occupied(mut slot) => {
            let same = match (slot.get(), &url) {
                (Some(a), Some(b)) => crate::config::same_server_url(a, b),
                _ => false,
            };
            if !same {
                slot.insert(None);
            }
        }
    }
}

#[cfg(test)]
mod tests;
