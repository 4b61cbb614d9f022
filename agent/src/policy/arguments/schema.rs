//! Reading a rule's condition against a tool's `inputSchema` (`toolwall config check`): a
//! condition that can never hold on what the schema declares is named before it is relied on.

use serde_json::Value;

use crate::config::ArgumentCondition;

/// Why `condition` can never hold for a tool whose `inputSchema` is `schema`, if it surely
/// cannot: its pointer names a property the schema closes out (`additionalProperties: false`)
/// or reaches a value of a declared type its test cannot read (a `range` on a string, a
/// `path_prefix` on a number — a block rule would then refuse every call). `None` when it may
/// hold, or the schema does not say (`toolwall config check`).
pub(crate) fn schema_mismatch(condition: &ArgumentCondition, schema: &Value) -> Option<String> {
    let mut at = schema;
    let mut walked = String::new();
    if let Some(rest) = condition.pointer.strip_prefix('/') {
        for raw in rest.split('/') {
            let key = raw.replace("~1", "/").replace("~0", "~");
            let next = if let Some(items) = at.get("items") {
                (raw == "*" || key.parse::<usize>().is_ok()).then_some(items)
            } else if let Some(props) = at.get("properties").and_then(Value::as_object) {
                match props.get(&key) {
                    Some(p) => Some(p),
                    None if raw != "*"
                        && at.get("additionalProperties") == Some(&Value::Bool(false)) =>
                    {
                        let known: Vec<&str> = props.keys().map(String::as_str).collect();
                        return Some(format!(
                            "{walked}/{key} is no property of its inputSchema (additionalProperties: false; it has {})",
                            known.join(", ")
                        ));
                    }
                    None => None,
                }
            } else {
                None
            };
            match next {
                Some(n) => {
                    at = n;
                    walked.push('/');
                    walked.push_str(raw);
                }
                None => return None,
            }
        }
    }
    let declared: Vec<&str> = match at.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => return None,
    };
    let (wants, test) = if condition.range.is_some() {
        (&["number", "integer"][..], "range")
    } else if condition.present.is_some() {
        return None;
    } else {
        (&["string"][..], "a string test")
    };
    (!declared.iter().any(|t| wants.contains(t))).then(|| {
        format!(
            "{} is declared {} in its inputSchema; {test} never holds on it",
            condition.pointer,
            declared.join(" or ")
        )
    })
}
