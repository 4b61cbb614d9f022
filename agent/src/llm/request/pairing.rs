//! Which call each tool result in a request answers, per dialect: the history's calls name
//! their tools by id, and each result names the id it answers. Result inspection judges a
//! result as its tool's (so that tool's exemptions hold) only when that pairing is unambiguous.

use std::collections::HashMap;

use serde_json::Value;

use super::{messages, str_at};

/// One tool result in a request: where its content is, which call it answers.
pub(super) struct Site {
    /// Pointer of the content in the request.
    pub(super) pointer: String,
    /// The id of the call it answers.
    pub(super) call_id: String,
    /// Whether it is a provider-hosted MCP tool's result (`mcp_tool_result`, an `mcp_call`'s
    /// output): it answers only a hosted call, and any other result only a call of the agent's.
    pub(super) hosted: bool,
}

/// The tool a call in the history names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct Call {
    /// Its name as the gate is asked about it.
    pub(super) name: String,
    /// Codex's namespace.
    pub(super) namespace: Option<String>,
    /// A provider-hosted MCP call's server (`server_name`, `server_label`): its result is a
    /// declared server's tool's only when that server's id is this label (not a label holding
    /// `__` that reads as another server's tool).
    pub(super) hosted: Option<String>,
}

impl Call {
    pub(super) fn named(name: String, namespace: Option<String>) -> Self {
        Call {
            name,
            namespace,
            hosted: None,
        }
    }
}

/// Call id → the tool it names, and the tool results.
pub(super) type Found = (HashMap<String, Call>, Vec<Site>);

/// Notes the tool a call id names. An id named for two tools (a model may write its own ids)
/// answers to neither: its result could be either's, so it is judged as no tool's, and no
/// tool's exemption applies to it.
pub(super) fn name_call(names: &mut HashMap<String, Call>, id: String, tool: Call) {
    match names.entry(id) {
        std::collections::hash_map::Entry::Vacant(e) => {
            e.insert(tool);
        }
        std::collections::hash_map::Entry::Occupied(mut e) => {
            if *e.get() != tool {
                *e.get_mut() = Call::default();
            }
        }
    }
}

/// A provider-hosted MCP call, named `mcp__{server}__{name}` as the response judge names it.
/// Without a server it is no known tool's.
fn hosted(block: &Value, server_key: &str) -> Call {
    match block.get(server_key).and_then(Value::as_str) {
        Some(server) if !server.is_empty() => Call {
            name: format!("mcp__{server}__{}", str_at(block, "name")),
            namespace: None,
            hosted: Some(server.to_owned()),
        },
        _ => Call::default(),
    }
}

/// `messages[].content[]`: `tool_use` / `mcp_tool_use` name calls, `tool_result` /
/// `mcp_tool_result` answer them (`tool_use_id`).
pub(super) fn anthropic(request: &Value) -> Found {
    let mut names = HashMap::new();
    let mut sites = Vec::new();
    for (i, message) in messages(request, "messages") {
        let Some(blocks) = message.get("content").and_then(Value::as_array) else {
            continue;
        };
        for (j, block) in blocks.iter().enumerate() {
            match str_at(block, "type") {
                "tool_use" | "server_tool_use" => {
                    let name = str_at(block, "name").to_owned();
                    name_call(
                        &mut names,
                        str_at(block, "id").to_owned(),
                        Call::named(name, None),
                    );
                }
                "mcp_tool_use" => {
                    let tool = hosted(block, "server_name");
                    name_call(&mut names, str_at(block, "id").to_owned(), tool);
                }
                kind @ ("tool_result" | "mcp_tool_result") if block.get("content").is_some() => {
                    sites.push(Site {
                        pointer: format!("/messages/{i}/content/{j}/content"),
                        call_id: str_at(block, "tool_use_id").to_owned(),
                        hosted: kind == "mcp_tool_result",
                    });
                }
                // A hosted server's listing handed back: its tools' texts are the server's.
                "mcp_tool_listing" if block.get("tools").is_some() => {
                    sites.push(Site {
                        pointer: format!("/messages/{i}/content/{j}/tools"),
                        call_id: String::new(),
                        hosted: false,
                    });
                }
                _ => {}
            }
        }
    }
    (names, sites)
}

/// `messages[]`: an assistant's `tool_calls[]` (and legacy `function_call`) name calls, a
/// `role: "tool"` message answers one (`tool_call_id`), a `role: "function"` one by name.
pub(super) fn chat(request: &Value) -> Found {
    let mut names = HashMap::new();
    let mut sites = Vec::new();
    for (i, message) in messages(request, "messages") {
        for call in message
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let name = call
                .get("function")
                .or_else(|| call.get("custom"))
                .map_or("", |f| str_at(f, "name"));
            name_call(
                &mut names,
                str_at(call, "id").to_owned(),
                Call::named(name.to_owned(), None),
            );
        }
        let role = str_at(message, "role");
        if matches!(role, "tool" | "function") && message.get("content").is_some() {
            let call_id = match role {
                "tool" => str_at(message, "tool_call_id").to_owned(),
                _ => {
                    let name = str_at(message, "name").to_owned();
                    name_call(
                        &mut names,
                        format!("function:{name}"),
                        Call::named(name.clone(), None),
                    );
                    format!("function:{name}")
                }
            };
            sites.push(Site {
                pointer: format!("/messages/{i}/content"),
                call_id,
                hosted: false,
            });
        }
    }
    (names, sites)
}

/// `input[]`: `function_call` / `custom_tool_call` items name calls (`call_id`), their
/// `*_output` items answer them; an `mcp_call` item carries its own output.
pub(super) fn responses(request: &Value) -> Found {
    let mut names = HashMap::new();
    let mut sites = Vec::new();
    for (i, item) in messages(request, "input") {
        match str_at(item, "type") {
            kind if kind.ends_with("_call")
                && item.get("call_id").is_some()
                && kind != "mcp_call" =>
            {
                let namespace = item
                    .get("namespace")
                    .and_then(Value::as_str)
                    .map(str::to_owned);
                let name = str_at(item, "name").to_owned();
                name_call(
                    &mut names,
                    str_at(item, "call_id").to_owned(),
                    Call::named(name, namespace),
                );
            }
            // Every kind of call output an agent hands back (`function_call_output`,
            // `custom_tool_call_output`, `local_shell_call_output`, `shell_call_output`,
            // `apply_patch_call_output`, `computer_call_output`, ...).
            kind if kind.ends_with("_output")
                && kind != "tool_search_output"
                && item.get("output").is_some() =>
            {
                sites.push(Site {
                    pointer: format!("/input/{i}/output"),
                    call_id: str_at(item, "call_id").to_owned(),
                    hosted: false,
                });
            }
            // Hosted tools' results handed back in the history, the errors a server's hosted
            // tool or listing failed with, and the tools a search found (the definitions of
            // servers and the client's tools): the model reads them too.
            kind @ ("code_interpreter_call"
            | "file_search_call"
            | "mcp_list_tools"
            | "tool_search_output") => {
                let fields: &[&str] = match kind {
                    "code_interpreter_call" => &["outputs"],
                    "file_search_call" => &["results"],
                    "tool_search_output" => &["tools", "output"],
                    _ => &["tools", "error"],
                };
                for field in fields.iter().filter(|f| item.get(**f).is_some()) {
                    sites.push(Site {
                        pointer: format!("/input/{i}/{field}"),
                        call_id: str_at(item, "id").to_owned(),
                        hosted: false,
                    });
                }
            }
            "mcp_call" => {
                let id = str_at(item, "id").to_owned();
                let fields = ["output", "error"]
                    .into_iter()
                    .filter(|f| item.get(*f).is_some());
                for field in fields {
                    sites.push(Site {
                        pointer: format!("/input/{i}/{field}"),
                        call_id: id.clone(),
                        hosted: true,
                    });
                }
                name_call(&mut names, id, hosted(item, "server_label"));
            }
            _ => {}
        }
    }
    (names, sites)
}
