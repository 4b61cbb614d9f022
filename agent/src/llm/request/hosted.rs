//! Tools the provider runs itself, judged in the request that enables them: an MCP server the
//! provider connects to runs whatever tools the request lets it, and toolwall sees the call only
//! after it ran (an `mcp_call` or `mcp_tool_use` in the response). So each hosted MCP tool a
//! request enables is asked of the gate by name, `mcp__{server}__{tool}` (as the backstop names
//! an MCP call with a `server_label` / `server_name`), at the inspected stage:
//!
//! - OpenAI Responses `tools[]` entries `type: "mcp"` (server URL or connector alike, also
//!   inside namespaces and `tool_search_output` items of `input[]`): denied names leave
//!   `allowed_tools` (a list, or a filter's `tool_names`); an entry left with none is removed.
//!   An entry without such a list lets the provider run any tool of the server: refused.
//!   A `tool_choice` forcing a denied hosted tool is refused.
//! - Anthropic `mcp_servers[]` (`tool_configuration`, mcp-client-2025-04-04) and `mcp_toolset`
//!   definitions (mcp-client-2025-11-20 and later, in `tools[]` or a `tool_addition` block):
//!   denied tools are disabled. Tools enabled by default are judged when their names are
//!   known (a toolset's pinned `tools` listing, or an `mcp_tool_listing` block of the
//!   conversation, turned into an explicit list); otherwise the request is refused. A
//!   `tool_addition` block of a denied tool is removed.
//!
//! A tool whose argument rules apply cannot be run by the provider either (the arguments are
//! never seen before it runs), unless it requires an approval toolwall judges
//! (`require_approval`, OpenAI): it is taken out like a denied one.

use serde_json::{Map, Value, json};

use crate::decision::{CallQuery, CallStage, Gate};

/// Why a request enabling hosted tools is not forwarded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Unjudgeable {
    #[error(
        "the hosted MCP server {server:?} (tools[].type \"mcp\") has no allowed_tools list, so the provider could run any of its tools, which toolwall cannot judge; list the tools it may run in allowed_tools"
    )]
    OpenAiUnlisted { server: String },
    #[error(
        "a hosted MCP tool definition (type \"mcp\") without a server_label cannot be judged; give it one"
    )]
    NoServerLabel,
    #[error(
        "the hosted MCP definition of {server:?} has an allowed_tools toolwall cannot read ({what}); list tool names as strings"
    )]
    BadList { server: String, what: String },
    #[error("tool_choice forces the hosted MCP tool {tool:?}, which the policy denies: {reason}")]
    ForcedDenied { tool: String, reason: String },
    #[error(
        "the MCP server {server:?} (mcp_servers) enables all of its tools, which toolwall cannot judge; list them: tool_configuration.allowed_tools, or an mcp_toolset with default_config {{\"enabled\": false}} and each tool enabled in configs"
    )]
    AnthropicServerUnlisted { server: String },
    #[error(
        "the mcp_toolset of {server:?} enables the server's tools by default and toolwall cannot know them; set default_config {{\"enabled\": false}} and enable each tool in configs (or pin the listing in tools)"
    )]
    ToolsetUnlisted { server: String },
    #[error(
        "the mcp_approval_response {id:?} approves {tool:?}, which the policy denies: {reason}"
    )]
    ApprovalDenied {
        id: String,
        tool: String,
        reason: String,
        /// The `mcp_tool_call_intercepted` record of the refusal.
        record: Box<crate::events::Event>,
    },
    #[error(
        "the request offers a Gemini tool of a kind toolwall does not know ({kind:?}): the provider could run it, or an MCP server's tools, unjudged; it is not forwarded"
    )]
    GeminiToolKind { kind: String },
    #[error(
        "the Gemini request's {what} is not a list, so toolwall cannot read what it holds; it is not forwarded"
    )]
    GeminiShape { what: String },
    #[error(
        "the mcp_approval_response {id:?} approves a call toolwall cannot find (neither in this request's input nor in a response it passed), so it cannot judge what it approves; send the mcp_approval_request item with it"
    )]
    ApprovalUnknown { id: String },
}

/// What the gate says of one hosted tool, asked by name.
pub(super) struct Judge<'a> {
    pub(super) gate: &'a dyn Gate,
}

impl Judge<'_> {
    /// Why `mcp__{server}__{tool}` may not be run by the provider, if it may not: denied by
    /// name, or argument rules apply and `approved` (the provider asks first) is false.
    pub(super) fn refusal(&self, server: &str, tool: &str, approved: bool) -> Option<String> {
        let name = mcp_name(server, tool);
        let query = CallQuery {
            server_id: None,
            name: &name,
            namespace: None,
            stage: CallStage::Inspected,
            arguments: None,
        };
        let decision = self.gate.check_call(&query);
        if decision.is_blocked() {
            return Some(decision.reason);
        }
        (!approved && self.gate.needs_arguments(&query)).then(|| {
            "argument rules apply to it, and the provider would run it without toolwall seeing its arguments".to_owned()
        })
    }
}

/// The name the gate is asked about for `tool` of the hosted MCP server `server`.
pub(crate) fn mcp_name(server: &str, tool: &str) -> String {
    format!("mcp__{server}__{tool}")
}

fn str_at<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// Judges every hosted MCP definition of `request` in place. Returns the tools taken out
/// (`mcp__server__tool`), or why the request cannot be forwarded.
pub(super) fn judge_definitions(
    judge: &Judge<'_>,
    request: &mut Value,
) -> Result<Vec<String>, Unjudgeable> {
    let mut hidden = Vec::new();
    let Some(object) = request.as_object_mut() else {
        return Ok(hidden);
    };
    let listings = listings(object);
    let mut removed_servers = Vec::new();
    if let Some(tools) = object.get_mut("tools").and_then(Value::as_array_mut) {
        judge_tools(judge, tools, &listings, &mut hidden, &mut removed_servers)?;
    }
    for item in object
        .get_mut("input")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if str_at(item, "type") == "tool_search_output"
            && let Some(tools) = item.get_mut("tools").and_then(Value::as_array_mut)
        {
            judge_tools(judge, tools, &listings, &mut hidden, &mut removed_servers)?;
        }
    }
    judge_choice(judge, object, &removed_servers)?;
    judge_servers(judge, object, &mut hidden)?;
    judge_additions(judge, object, &listings, &mut hidden)?;
    Ok(hidden)
}

/// The tool names each MCP server listed in the conversation (`mcp_tool_listing` blocks of
/// Anthropic messages; the last one of a server counts, as the provider uses it).
fn listings(object: &Map<String, Value>) -> Vec<(String, Vec<String>)> {
    let mut found: Vec<(String, Vec<String>)> = Vec::new();
    for message in object
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for block in message
            .get("content")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if str_at(block, "type") != "mcp_tool_listing" {
                continue;
            }
            let server = str_at(block, "mcp_server_name").to_owned();
            let names = listed_names(block.get("tools"));
            found.retain(|(s, _)| *s != server);
            found.push((server, names));
        }
    }
    found
}

/// The `name`s of a tool listing's entries.
fn listed_names(tools: Option<&Value>) -> Vec<String> {
    tools
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|t| str_at(t, "name").to_owned())
        .collect()
}

/// One `tools[]` array: OpenAI `mcp` entries and Anthropic `mcp_toolset` entries judged
/// (namespaces' inner `tools` too); an OpenAI entry left with no tool is removed.
fn judge_tools(
    judge: &Judge<'_>,
    tools: &mut Vec<Value>,
    listings: &[(String, Vec<String>)],
    hidden: &mut Vec<String>,
    removed_servers: &mut Vec<String>,
) -> Result<(), Unjudgeable> {
    let mut keep = Vec::with_capacity(tools.len());
    for mut tool in std::mem::take(tools) {
        match str_at(&tool, "type") {
            "mcp" => {
                if openai_entry(judge, &mut tool, hidden)? {
                    keep.push(tool);
                } else {
                    removed_servers.push(str_at(&tool, "server_label").to_owned());
                }
            }
            "mcp_toolset" => {
                toolset(judge, &mut tool, listings, hidden)?;
                keep.push(tool);
            }
            _ => {
                if let Some(inner) = tool.get_mut("tools").and_then(Value::as_array_mut) {
                    judge_tools(judge, inner, listings, hidden, removed_servers)?;
                }
                keep.push(tool);
            }
        }
    }
    *tools = keep;
    Ok(())
}

/// An OpenAI `type: "mcp"` entry: denied names out of its list. `false`: no tool is left, the
/// entry goes.
fn openai_entry(
    judge: &Judge<'_>,
    entry: &mut Value,
    hidden: &mut Vec<String>,
) -> Result<bool, Unjudgeable> {
    let server = match entry.get("server_label").and_then(Value::as_str) {
        Some(s) if !s.is_empty() => s.to_owned(),
        _ => return Err(Unjudgeable::NoServerLabel),
    };
    let approval = entry
        .get("require_approval")
        .cloned()
        .unwrap_or(Value::Null);
    let list = match entry.get_mut("allowed_tools") {
        Some(Value::Array(names)) => names,
        Some(Value::Object(filter)) => match filter.get_mut("tool_names") {
            Some(Value::Array(names)) => names,
            // `read_only` alone: any read-only tool of the server, unknown by name.
            None | Some(Value::Null) => return Err(Unjudgeable::OpenAiUnlisted { server }),
            Some(other) => {
                return Err(Unjudgeable::BadList {
                    server,
                    what: format!("tool_names is {other}"),
                });
            }
        },
        None | Some(Value::Null) => return Err(Unjudgeable::OpenAiUnlisted { server }),
        Some(other) => {
            return Err(Unjudgeable::BadList {
                server,
                what: format!("{other}"),
            });
        }
    };
    if let Some(bad) = list.iter().find(|n| !n.is_string()) {
        return Err(Unjudgeable::BadList {
            server,
            what: format!("an entry {bad}"),
        });
    }
    list.retain(|name| {
        let tool = name.as_str().unwrap_or_default();
        let approved = asks_approval(&approval, tool);
        match judge.refusal(&server, tool, approved) {
            Some(reason) => {
                tracing::info!(
                    server,
                    tool,
                    reason,
                    "hosted MCP tool taken out of the request"
                );
                hidden.push(mcp_name(&server, tool));
                false
            }
            None => true,
        }
    });
    Ok(!list.is_empty())
}

/// Whether an OpenAI `require_approval` makes the provider ask before running `tool` (the
/// `mcp_approval_request` is then judged with its arguments).
fn asks_approval(approval: &Value, tool: &str) -> bool {
    match approval {
        Value::String(s) => s == "always",
        Value::Object(filter) => filter
            .get("always")
            .and_then(|a| a.get("tool_names"))
            .and_then(Value::as_array)
            .is_some_and(|names| names.iter().any(|n| n.as_str() == Some(tool))),
        _ => false,
    }
}

/// A `tool_choice` of `type: "mcp"`: naming a denied tool, refused; forcing a server whose
/// entry was removed, `auto` (as a forced removed function is).
fn judge_choice(
    judge: &Judge<'_>,
    object: &mut Map<String, Value>,
    removed_servers: &[String],
) -> Result<(), Unjudgeable> {
    let Some(choice) = object.get_mut("tool_choice") else {
        return Ok(());
    };
    if str_at(choice, "type") != "mcp" {
        return Ok(());
    }
    let server = str_at(choice, "server_label").to_owned();
    if let Some(tool) = choice.get("name").and_then(Value::as_str)
        && let Some(reason) = judge.refusal(&server, tool, true)
    {
        return Err(Unjudgeable::ForcedDenied {
            tool: mcp_name(&server, tool),
            reason,
        });
    }
    if removed_servers.contains(&server) {
        *choice = Value::String("auto".to_owned());
    }
    Ok(())
}

/// Anthropic `mcp_servers[]`: a `tool_configuration` judged (allowed tools denied by name
/// taken out; a server left with none disabled); a server whose tools no configuration or
/// toolset bounds is refused.
fn judge_servers(
    judge: &Judge<'_>,
    object: &mut Map<String, Value>,
    hidden: &mut Vec<String>,
) -> Result<(), Unjudgeable> {
    let with_toolset = toolset_servers(object);
    let Some(servers) = object.get_mut("mcp_servers").and_then(Value::as_array_mut) else {
        return Ok(());
    };
    for server in servers {
        let name = str_at(server, "name").to_owned();
        let Some(config) = server
            .get_mut("tool_configuration")
            .filter(|c| !c.is_null())
        else {
            if with_toolset.contains(&name) {
                continue;
            }
            return Err(Unjudgeable::AnthropicServerUnlisted { server: name });
        };
        if config.get("enabled") == Some(&Value::Bool(false)) {
            continue;
        }
        // Enabled without a list: every tool of the server (mcp-client-2025-04-04).
        let Some(list) = config
            .get_mut("allowed_tools")
            .and_then(Value::as_array_mut)
        else {
            return Err(Unjudgeable::AnthropicServerUnlisted { server: name });
        };
        if let Some(bad) = list.iter().find(|n| !n.is_string()) {
            return Err(Unjudgeable::BadList {
                server: name,
                what: format!("an entry {bad}"),
            });
        }
        list.retain(|t| {
            let tool = t.as_str().unwrap_or_default();
            match judge.refusal(&name, tool, false) {
                Some(reason) => {
                    tracing::info!(
                        server = name,
                        tool,
                        reason,
                        "hosted MCP tool taken out of the request"
                    );
                    hidden.push(mcp_name(&name, tool));
                    false
                }
                None => true,
            }
        });
        if list.is_empty()
            && let Some(config) = config.as_object_mut()
        {
            config.insert("enabled".to_owned(), Value::Bool(false));
        }
    }
    Ok(())
}

/// The servers an `mcp_toolset` configures (in `tools[]` or a `tool_addition` definition).
fn toolset_servers(object: &Map<String, Value>) -> Vec<String> {
    let top = object
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten();
    let added = additions(object).filter_map(|tool| tool.get("definition"));
    top.chain(added)
        .filter(|t| str_at(t, "type") == "mcp_toolset")
        .map(|t| str_at(t, "mcp_server_name").to_owned())
        .collect()
}

/// The `tool` of every `tool_addition` block of the messages.
fn additions(object: &Map<String, Value>) -> impl Iterator<Item = &Value> {
    object
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| m.get("content").and_then(Value::as_array))
        .flatten()
        .filter(|b| str_at(b, "type") == "tool_addition")
        .filter_map(|b| b.get("tool"))
}

/// An `mcp_toolset`: each tool it enables judged, denied ones disabled in `configs`.
fn toolset(
    judge: &Judge<'_>,
    set: &mut Value,
    listings: &[(String, Vec<String>)],
    hidden: &mut Vec<String>,
) -> Result<(), Unjudgeable> {
    let server = str_at(set, "mcp_server_name").to_owned();
    let default_on = set
        .get("default_config")
        .and_then(|c| c.get("enabled"))
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let pinned = set.get("tools").filter(|t| t.is_array()).is_some();
    let known: Option<Vec<String>> = if pinned {
        Some(listed_names(set.get("tools")))
    } else {
        listings
            .iter()
            .find(|(s, _)| *s == server)
            .map(|(_, names)| names.clone())
    };
    let Some(object) = set.as_object_mut() else {
        return Ok(());
    };
    let mut configs = match object.remove("configs") {
        Some(Value::Object(c)) => c,
        _ => Map::new(),
    };
    let enabled = |configs: &Map<String, Value>, tool: &str| {
        configs
            .get(tool)
            .and_then(|c| c.get("enabled"))
            .and_then(Value::as_bool)
            .unwrap_or(default_on)
    };
    let mut candidates: Vec<String> = configs.keys().cloned().collect();
    if default_on {
        let Some(known) = known else {
            object.insert("configs".to_owned(), Value::Object(configs));
            return Err(Unjudgeable::ToolsetUnlisted { server });
        };
        candidates.extend(known.iter().cloned());
        if !pinned {
            // Known only from the conversation's listing: made an explicit list, so the
            // provider runs no tool the server adds since.
            for tool in &known {
                if enabled(&configs, tool) {
                    set_enabled(&mut configs, tool, true);
                }
            }
            object.insert("default_config".to_owned(), json!({"enabled": false}));
        }
    }
    for tool in candidates {
        if !enabled(&configs, &tool) {
            continue;
        }
        if let Some(reason) = judge.refusal(&server, &tool, false) {
            tracing::info!(
                server,
                tool,
                reason,
                "hosted MCP tool disabled in the request"
            );
            hidden.push(mcp_name(&server, &tool));
            set_enabled(&mut configs, &tool, false);
        }
    }
    if !configs.is_empty() {
        object.insert("configs".to_owned(), Value::Object(configs));
    }
    Ok(())
}

/// Sets `configs[tool].enabled`, keeping the entry's other settings.
fn set_enabled(configs: &mut Map<String, Value>, tool: &str, on: bool) {
    let entry = configs
        .entry(tool.to_owned())
        .or_insert_with(|| Value::Object(Map::new()));
    if !entry.is_object() {
        *entry = Value::Object(Map::new());
    }
    if let Some(entry) = entry.as_object_mut() {
        entry.insert("enabled".to_owned(), Value::Bool(on));
    }
}

/// Anthropic `tool_addition` blocks: a toolset defined in one judged like one in `tools[]`;
/// one adding a denied tool (an `mcp_tool_reference`, a `tool_reference` or a definition by
/// name) removed.
fn judge_additions(
    judge: &Judge<'_>,
    object: &mut Map<String, Value>,
    listings: &[(String, Vec<String>)],
    hidden: &mut Vec<String>,
) -> Result<(), Unjudgeable> {
    let denied_name = |name: &str| {
        !name.is_empty()
            && judge
                .gate
                .check_call(&CallQuery {
                    server_id: None,
                    name,
                    namespace: None,
                    stage: CallStage::Inspected,
                    arguments: None,
                })
                .is_blocked()
    };
    for message in object
        .get_mut("messages")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        let Some(blocks) = message.get_mut("content").and_then(Value::as_array_mut) else {
            continue;
        };
        let mut keep = Vec::with_capacity(blocks.len());
        for mut block in std::mem::take(blocks) {
            if str_at(&block, "type") != "tool_addition" {
                keep.push(block);
                continue;
            }
            let Some(tool) = block.get_mut("tool") else {
                keep.push(block);
                continue;
            };
            let name = match str_at(tool, "type") {
                "mcp_tool_reference" => {
                    let (server, name) = (str_at(tool, "server_name"), str_at(tool, "name"));
                    judge
                        .refusal(server, name, false)
                        .map(|_| mcp_name(server, name))
                }
                "tool_reference" => {
                    Some(str_at(tool, "name").to_owned()).filter(|n| denied_name(n))
                }
                "tool_definition" => match tool.get_mut("definition") {
                    Some(d) if str_at(d, "type") == "mcp_toolset" => {
                        toolset(judge, d, listings, hidden)?;
                        None
                    }
                    Some(d) => Some(str_at(d, "name").to_owned()).filter(|n| denied_name(n)),
                    None => None,
                },
                _ => None,
            };
            match name {
                Some(name) => {
                    tracing::info!(
                        tool = name,
                        "tool_addition of a denied tool taken out of the request"
                    );
                    hidden.push(name);
                }
                None => keep.push(block),
            }
        }
        *blocks = keep;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
