//! YAML itself (aliases are bounded, the rest of the language accepted) and the embedded default,
//! which explains every key the parser accepts.

use super::*;

#[test]
fn many_yaml_aliases_are_refused_with_the_line_of_the_first_past_the_limit() {
    // One anchored value and MAX_ALIASES + 1 aliases of it, one per line from line 5.
    let mut text =
        String::from("sandbox:\n  mcp:\n    name_patterns:\n      - &a \"{server}__{tool}\"\n");
    for _ in 0..=MAX_ALIASES {
        text.push_str("      - *a\n");
    }
    let error = error_text(&text);
    let line = 4 + MAX_ALIASES + 1;
    assert!(
        error.starts_with(&format!("policy.yaml:{line}:")),
        "the line of alias {}: {error}",
        MAX_ALIASES + 1
    );
    assert!(
        error.contains("aliases") && error.contains("hint:"),
        "{error}"
    );
    // Aliases in a flow list, on one line.
    let flow = format!(
        "sandbox:\n  mcp:\n    name_patterns: [&a \"{{server}}__{{tool}}\"{}]\n",
        ",*a".repeat(5_000)
    );
    assert!(error_text(&flow).starts_with("policy.yaml:3:"));
    // A big file allows fewer: each alias may expand to the whole file.
    let padding = format!("# {}\n", "x".repeat(900 * 1024));
    let big = format!(
        "{padding}{}",
        text.replace(&"      - *a\n".repeat(MAX_ALIASES - 20), "")
    );
    assert!(error_text(&big).contains("aliases"), "{}", error_text(&big));
}

#[test]
fn a_few_aliases_quoted_globs_comments_and_block_scalars_are_accepted() {
    let mut text = String::from(
        "# * a comment with * stars * is not an alias\nsandbox:\n  mcp:\n    denied_servers: [{id: \"*-beta\"}, {id: '*'}, {id: \"a\\\" *\"}]\n    argument_rules:\n      - tool: \"*\"\n        server: '*'\n        action: block\n        when:\n          - &cond {pointer: /path, glob: \"/etc/*\"}\n          - *cond\n        reason: >-\n",
    );
    // A block scalar's lines are text: bullets are not aliases.
    for _ in 0..2 * MAX_ALIASES {
        text.push_str("          * never * this\n");
    }
    text.push_str(
        "      - {tool: \"x\", action: block, when: [*cond, *cond], reason: \"* and *\"}  # *\n",
    );
    let config = parse(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.sandbox.mcp.argument_rules.len(), 2);
    assert_eq!(config.sandbox.mcp.argument_rules[1].when.len(), 2);
    assert!(
        config.sandbox.mcp.argument_rules[0]
            .reason
            .as_deref()
            .is_some_and(|r| r.starts_with("* never * this * never")),
        "{:?}",
        config.sandbox.mcp.argument_rules[0].reason
    );
}

/// Every key the configuration accepts, as dotted paths (`sandbox.mcp.servers[].url`), found by
/// tracing the `Deserialize` implementations themselves: a key added to a config type is in
/// this list without anyone remembering to add it.
fn accepted_keys() -> Vec<String> {
    use serde_reflection::{ContainerFormat, Format, Samples, Tracer, TracerConfig};
    let mut tracer = Tracer::new(TracerConfig::default());
    tracer
        .trace_type::<Config>(&Samples::new())
        .expect("trace the configuration's types");
    // Enums are traced by one variant only; their variants are values, not keys, so the
    // registry is taken as it is.
    let registry = tracer.registry_unchecked();

    fn walk(
        registry: &serde_reflection::Registry,
        format: &Format,
        path: &str,
        out: &mut Vec<String>,
    ) {
        match format {
            Format::TypeName(name) => {
                if let Some(ContainerFormat::Struct(fields)) = registry.get(name) {
                    for field in fields {
                        let key = if path.is_empty() {
                            field.name.clone()
                        } else {
                            format!("{path}.{}", field.name)
                        };
                        out.push(key.clone());
                        walk(registry, &field.value, &key, out);
                    }
                }
            }
            Format::Option(inner) => walk(registry, inner, path, out),
            Format::Seq(inner) => walk(registry, inner, &format!("{path}[]"), out),
            // Map keys are names the user picks (server ids, header names), not schema keys.
            Format::Map { value, .. } => walk(registry, value, &format!("{path}.*"), out),
            _ => {}
        }
    }
    let mut keys = Vec::new();
    walk(&registry, &Format::TypeName("Config".into()), "", &mut keys);
    keys
}

/// The dotted paths of the keys `default.yaml` writes, live or commented out: a comment whose
/// `#` starts its line is read as if the `#` were a space, so a commented example keeps its
/// place in the tree. List items add `[]` to their parent, flow mappings (`{min: 1, max: 2}`)
/// their keys.
fn written_paths() -> std::collections::BTreeSet<String> {
    let is_key =
        |key: &str| !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    let join = |parent: &str, key: &str| {
        if parent.is_empty() {
            key.to_owned()
        } else {
            format!("{parent}.{key}")
        }
    };
    let mut out = std::collections::BTreeSet::new();
    // (indentation, path) of the keys the next line may sit under.
    let mut stack: Vec<(usize, String)> = Vec::new();
    for raw in DEFAULT_YAML.lines() {
        let line = match raw.trim_start().strip_prefix('#') {
            Some(rest) => format!("{} {rest}", &raw[..raw.len() - raw.trim_start().len()]),
            None => raw.to_owned(),
        };
        let indent = line.len() - line.trim_start().len();
        let mut rest = line.trim_start();
        let mut key_indent = indent;
        if let Some(item) = rest.strip_prefix("- ") {
            while stack.last().is_some_and(|(i, _)| *i >= indent) {
                stack.pop();
            }
            let parent = stack.last().map_or("", |(_, p)| p.as_str());
            stack.push((indent, format!("{parent}[]")));
            key_indent = indent + 2 + (item.len() - item.trim_start().len());
            rest = item.trim_start();
        }
        let Some((key, value)) = rest.split_once(':') else {
            continue;
        };
        if !is_key(key) {
            continue;
        }
        while stack.last().is_some_and(|(i, _)| *i >= key_indent) {
            stack.pop();
        }
        let path = join(stack.last().map_or("", |(_, p)| p.as_str()), key);
        if let Some(flow) = value.trim().strip_prefix('{') {
            for part in flow.split([',', '}']) {
                if let Some((inner, _)) = part.split_once(':')
                    && is_key(inner.trim())
                {
                    out.insert(join(&path, inner.trim()));
                }
            }
        }
        out.insert(path.clone());
        stack.push((key_indent, path));
    }
    out
}

/// `toolwall config default` is the reference: each key the configuration accepts is explained
/// there, at its place in the tree, as a live key or a commented example (`#  key:`), so a user
/// never meets a key that the default does not name. The test fails on a key added to a config
/// type and not to `default.yaml`, also when a key of the same name stands elsewhere.
#[test]
fn the_embedded_default_explains_every_accepted_key() {
    let keys = accepted_keys();
    assert!(
        keys.iter().any(|k| k == "sandbox.mcp.servers[].url"),
        "the trace reaches nested lists: {keys:?}"
    );
    let written = written_paths();
    assert!(
        written.contains("sandbox.mcp.servers[].url"),
        "commented examples are read at their place: {written:?}"
    );
    // `*` in an accepted path is a map's key, which the user names (a server id).
    let matches = |accepted: &str, written: &str| {
        let (a, w): (Vec<&str>, Vec<&str>) =
            (accepted.split('.').collect(), written.split('.').collect());
        a.len() == w.len() && a.iter().zip(&w).all(|(a, w)| *a == "*" || a == w)
    };
    let missing: Vec<&String> = keys
        .iter()
        .filter(|accepted| !written.iter().any(|w| matches(accepted, w)))
        .collect();
    assert!(
        missing.is_empty(),
        "keys the configuration accepts that `toolwall config default` does not explain at their place: {missing:?}"
    );
}
