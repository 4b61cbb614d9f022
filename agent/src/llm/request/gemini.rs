//! A Gemini request (`generateContent`, `streamGenerateContent`, `countTokens`): the calls and
//! results in `contents[].parts[]`, the functions offered in `tools[].functionDeclarations`.
//!
//! The API reads a field in its JSON name (`functionCall`) and its proto name
//! (`function_call`) alike, so both are read here; a part or tool holding both is two of them.

use serde_json::Value;

use super::hosted::Unjudgeable;
use super::pairing::{Call, Found, Site};

/// The kinds of `tools[]` entry the Gemini API has, in both spellings: function declarations
/// (the agent runs them: judged by name here, by call in the response) and the tools Google
/// runs itself, which run no tool of the agent's and reach no MCP server.
const TOOL_KINDS: &[&str] = &[
    "functionDeclarations",
    "function_declarations",
    "googleSearch",
    "google_search",
    "googleSearchRetrieval",
    "google_search_retrieval",
    "codeExecution",
    "code_execution",
    "urlContext",
    "url_context",
    "computerUse",
    "computer_use",
    "fileSearch",
    "file_search",
    "googleMaps",
    "google_maps",
    "enterpriseWebSearch",
    "enterprise_web_search",
    "retrieval",
];

const DECLARATIONS: [&str; 2] = ["functionDeclarations", "function_declarations"];

/// The contents of a request the model reads: `contents[]`, and the system instruction (one
/// content of its own), with their pointers.
fn contents(request: &Value) -> Vec<(String, &Value)> {
    let mut out: Vec<(String, &Value)> = super::messages(request, "contents")
        .map(|(i, c)| (format!("/contents/{i}"), c))
        .collect();
    for key in ["systemInstruction", "system_instruction"] {
        if let Some(c) = request.get(key) {
            out.push((format!("/{key}"), c));
        }
    }
    out
}

/// `functionCall` parts name calls, `functionResponse` parts answer them (by `id` when they
/// have one, else by their place, which later turns keep), in every content the model reads.
pub(super) fn found(request: &Value) -> Found {
    let mut names = std::collections::HashMap::new();
    let mut sites = Vec::new();
    for (at, content) in contents(request) {
        let Some(parts) = content.get("parts").and_then(Value::as_array) else {
            continue;
        };
        for (j, part) in parts.iter().enumerate() {
            let Some(part) = part.as_object() else {
                continue;
            };
            // A call with an id names its tool too: a response claiming another tool's name
            // under that id answers to neither.
            for key in ["functionCall", "function_call"] {
                if let Some(call) = part.get(key)
                    && let Some(id) = call.get("id").and_then(Value::as_str)
                {
                    let name = super::str_at(call, "name").to_owned();
                    super::pairing::name_call(&mut names, id.to_owned(), Call::named(name, None));
                }
            }
            // A function's answer: its `response`, and the `parts` (media, text) it may carry.
            for key in ["functionResponse", "function_response"] {
                let Some(answer) = part.get(key) else {
                    continue;
                };
                let name = super::str_at(answer, "name").to_owned();
                let call_id = match super::str_at(answer, "id") {
                    "" => format!("{}/parts/{j}", &at[1..]),
                    id => id.to_owned(),
                };
                for field in ["response", "parts"] {
                    if answer.get(field).is_some() {
                        super::pairing::name_call(
                            &mut names,
                            call_id.clone(),
                            Call::named(name.clone(), None),
                        );
                        sites.push(Site {
                            pointer: format!("{at}/parts/{j}/{key}/{field}"),
                            call_id: call_id.clone(),
                            hosted: false,
                        });
                    }
                }
            }
        }
    }
    (names, sites)
}

/// Refuses a request whose lists are not lists where toolwall reads them (`contents`, `parts`,
/// `tools`, `functionDeclarations`): what it skips as no list, a lenient reader may take.
pub(super) fn known_shapes(request: &Value) -> Result<(), Unjudgeable> {
    let not_list = |v: Option<&Value>| v.is_some_and(|v| !v.is_array() && !v.is_null());
    let bad = |what: &str| {
        Err(Unjudgeable::GeminiShape {
            what: what.to_owned(),
        })
    };
    if not_list(request.get("contents")) {
        return bad("contents");
    }
    if not_list(request.get("tools")) {
        return bad("tools");
    }
    for (at, content) in contents(request) {
        if not_list(content.get("parts")) {
            return bad(&format!("{at}/parts"));
        }
    }
    for (i, tool) in super::messages(request, "tools") {
        for key in DECLARATIONS {
            if not_list(tool.get(key)) {
                return bad(&format!("/tools/{i}/{key}"));
            }
        }
    }
    Ok(())
}

/// Refuses a request offering a tool of a kind the API may have and toolwall does not know
/// (one could run an MCP server's tools at Google's side, unjudged).
pub(super) fn known_tools(request: &Value) -> Result<(), Unjudgeable> {
    for tool in request
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let Some(tool) = tool.as_object() else {
            continue;
        };
        if let Some(kind) = tool.keys().find(|k| !TOOL_KINDS.contains(&k.as_str())) {
            return Err(Unjudgeable::GeminiToolKind { kind: kind.clone() });
        }
    }
    Ok(())
}

/// Takes the denied functions out of `tools[].functionDeclarations` and out of
/// `toolConfig.functionCallingConfig.allowedFunctionNames`; an entry left with no declaration
/// is removed, `tools` left empty with its `toolConfig`. Returns the names taken out.
pub(super) fn hide_denied(request: &mut Value, denied: &dyn Fn(&str) -> bool) -> Vec<String> {
    let mut hidden = Vec::new();
    let Some(object) = request.as_object_mut() else {
        return hidden;
    };
    if let Some(tools) = object.get_mut("tools").and_then(Value::as_array_mut) {
        tools.retain_mut(|tool| {
            let Some(tool) = tool.as_object_mut() else {
                return true;
            };
            let mut had = false;
            for key in DECLARATIONS {
                let Some(list) = tool.get_mut(key).and_then(Value::as_array_mut) else {
                    continue;
                };
                had = true;
                list.retain(|d| {
                    let name = super::str_at(d, "name");
                    let deny = denied(name);
                    if deny {
                        hidden.push(name.to_owned());
                    }
                    !deny
                });
                if list.is_empty() {
                    tool.remove(key);
                }
            }
            !had || !tool.is_empty()
        });
        if tools.is_empty() {
            object.remove("tools");
            object.remove("toolConfig");
            object.remove("tool_config");
        }
    }
    if hidden.is_empty() {
        return hidden;
    }
    for config in ["toolConfig", "tool_config"] {
        let Some(calling) = object
            .get_mut(config)
            .and_then(Value::as_object_mut)
            .and_then(|c| {
                ["functionCallingConfig", "function_calling_config"]
                    .into_iter()
                    .find(|k| c.get(*k).is_some())
                    .and_then(|k| c.get_mut(k))
            })
            .and_then(Value::as_object_mut)
        else {
            continue;
        };
        for key in ["allowedFunctionNames", "allowed_function_names"] {
            let Some(list) = calling.get_mut(key).and_then(Value::as_array_mut) else {
                continue;
            };
            list.retain(|n| !n.as_str().is_some_and(|n| hidden.iter().any(|h| h == n)));
            if list.is_empty() {
                // Forced to call one of no function: let the model choose.
                calling.remove(key);
                calling.insert("mode".to_owned(), Value::String("AUTO".to_owned()));
            }
        }
    }
    hidden
}

/// What a withheld result becomes: the API takes a `response` only as a JSON object, and
/// reads its `error` as the function's failure.
pub(super) fn withheld(reason: &str) -> Value {
    serde_json::json!({ "error": format!("toolwall withheld this result: {reason}") })
}
