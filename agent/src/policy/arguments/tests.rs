use serde_json::json;

use super::*;
use crate::config::{ArgumentCondition, Config};

fn pass() -> Judgement {
    Judgement::default()
}

fn blocked(j: &Judgement) -> bool {
    j.block.is_some()
}

fn rules(yaml: &str) -> ArgumentRules {
    let config = Config::parse(
        &format!("sandbox:\n  mcp:\n    argument_rules:\n{yaml}"),
        "test.yaml",
    )
    .expect("valid config");
    ArgumentRules::new(&config.sandbox.mcp.argument_rules).expect("compiles")
}

const ETC: &str = "      - name: no-etc\n        tool: write_file\n        action: block\n        when:\n          - pointer: /path\n            path_prefix: /etc\n";

#[test]
fn a_path_rule_blocks_one_call_of_a_tool_and_allows_another() {
    let r = rules(ETC);
    assert_eq!(
        r.judge("files", "write_file", &json!({"path": "/tmp/x"})),
        pass()
    );
    for path in [
        "/etc/passwd",
        "/etc",
        "/tmp/../etc/shadow",
        "//etc/./x",
        "/../../etc/x",
    ] {
        let verdict = r.judge("files", "write_file", &json!({ "path": path }));
        assert!(
            verdict.block.as_deref().is_some_and(
                |why| why.contains("\"no-etc\"") && why.contains("/path is under /etc")
            ),
            "{path}: {verdict:?}"
        );
    }
    // Whole segments only; other tools are not this rule's.
    assert_eq!(
        r.judge("files", "write_file", &json!({"path": "/etcetera/x"})),
        pass()
    );
    assert_eq!(
        r.judge("files", "read_file", &json!({"path": "/etc/passwd"})),
        pass()
    );
    assert_eq!(r.judge("files", "write_file", &json!({})), pass());
}

#[test]
fn what_a_block_rule_cannot_judge_is_blocked_and_an_allow_rule_does_not_hold() {
    let r = rules(ETC);
    for args in [
        json!({"path": "etc/passwd"}),
        json!({"path": "../etc/passwd"}),
        json!({"path": ["/etc/passwd"]}),
        json!({"path": 7}),
        json!({"path": "file:///etc/passwd"}),
    ] {
        let verdict = r.judge("files", "write_file", &args);
        assert!(
            verdict
                .block
                .as_deref()
                .is_some_and(|why| why.contains("cannot judge")),
            "{args}: {verdict:?}"
        );
    }
    let allow = rules(
        "      - tool: write_file\n        action: allow\n        when:\n          - pointer: /path\n            path_prefix: /home/u\n      - tool: write_file\n        action: block\n        when:\n          - pointer: /path\n            present: true\n",
    );
    assert_eq!(
        allow.judge("s", "write_file", &json!({"path": "/home/u/notes"})),
        pass()
    );
    assert!(blocked(&allow.judge(
        "s",
        "write_file",
        &json!({"path": "notes"})
    )));
    assert!(blocked(&allow.judge(
        "s",
        "write_file",
        &json!({"path": "/home/u/../v/x"})
    )));
}

#[test]
fn glob_regex_range_and_presence() {
    let r = rules(concat!(
        "      - server: shell\n        tool: run\n        action: block\n        reason: no package installs\n        when:\n          - pointer: /cmd\n            regex: '^(apt|pip) install'\n",
        "      - tool: write_file\n        action: block\n        when:\n          - pointer: /path\n            glob: '**/*.env'\n",
        "      - tool: transfer\n        action: block\n        when:\n          - pointer: /amount\n            range: { min: 1000 }\n          - pointer: /approved_by\n            present: false\n",
    ));
    let block = |s: &str, t: &str, a: serde_json::Value| blocked(&r.judge(s, t, &a));
    assert!(block("shell", "run", json!({"cmd": "pip install x"})));
    assert!(
        r.judge("shell", "run", &json!({"cmd": "pip install x"}))
            .block
            .is_some_and(|why| why.ends_with(": no package installs"))
    );
    assert!(!block("shell", "run", json!({"cmd": "echo pip install"})));
    assert!(!block("other", "run", json!({"cmd": "pip install x"})));
    assert!(block("s", "write_file", json!({"path": "/srv/app/.env"})));
    assert!(!block(
        "s",
        "write_file",
        json!({"path": "/srv/app/env.txt"})
    ));
    assert!(block("s", "transfer", json!({"amount": 5000})));
    assert!(block("s", "transfer", json!({"amount": 1000.0})));
    assert!(!block("s", "transfer", json!({"amount": 999})));
    assert!(!block(
        "s",
        "transfer",
        json!({"amount": 5000, "approved_by": "ann"})
    ));
    // A string where a number is tested cannot be judged: blocked.
    assert!(block("s", "transfer", json!({"amount": "5000"})));
}

#[test]
fn redact_keeps_the_call_and_names_the_pointers() {
    let r = rules(
        "      - name: tokens\n        tool: '*'\n        action: redact\n        when:\n          - pointer: /token\n            present: true\n",
    );
    let args = json!({"token": "s3cret", "q": "x"});
    let judged = r.judge("s", "search", &args);
    assert!(judged.redacted_by[0].contains("\"tokens\""), "{judged:?}");
    assert_eq!(
        redacted(&args, &judged.redact),
        json!({"token": REDACTED, "q": "x"})
    );
    assert_eq!(r.judge("s", "search", &json!({"q": "x"})), pass());
}

#[test]
fn first_rule_that_holds_decides_and_apply_to_says_which_tools_are_judged() {
    let r = rules(concat!(
        "      - tool: write_file\n        action: allow\n        when:\n          - pointer: /path\n            path_prefix: /tmp\n",
        "      - tool: write_*\n        action: block\n        when:\n          - pointer: /path\n            glob: '/**'\n",
    ));
    assert_eq!(
        r.judge("s", "write_file", &json!({"path": "/tmp/a"})),
        pass()
    );
    assert!(blocked(&r.judge(
        "s",
        "write_file",
        &json!({"path": "/var/a"})
    )));
    assert!(r.apply_to("s", "write_file") && r.apply_to("s", "write_note"));
    assert!(!r.apply_to("s", "read_file"));
    assert!(!ArgumentRules::default().apply_to("s", "write_file"));
}

/// The ways around argument rules, each held: JSON inside strings, every element of an array,
/// paths through symlinks, and redaction whatever else decides.
#[test]
fn strings_holding_json_every_element_symlinks_and_redaction_whatever_decides() {
    // A scalar where the pointer goes on cannot be judged (the SDK decodes JSON strings).
    let r = rules(
        "      - tool: read_files\n        action: block\n        when:\n          - pointer: /paths/0\n            path_prefix: /etc\n",
    );
    assert!(blocked(&r.judge(
        "s",
        "read_files",
        &json!({"paths": "[\"/etc/hostname\"]"})
    )));
    assert!(!blocked(&r.judge(
        "s",
        "read_files",
        &json!({"paths": ["/tmp/x"]})
    )));
    // `*` reaches every element: any one under /etc blocks; an allow rule needs them all.
    let r = rules(concat!(
        "      - tool: read_many\n        action: allow\n        when:\n          - pointer: /paths/*\n            path_prefix: /tmp\n",
        "      - tool: read_many\n        action: block\n        when:\n          - pointer: /paths/*\n            path_prefix: /\n",
    ));
    assert!(!blocked(&r.judge(
        "s",
        "read_many",
        &json!({"paths": ["/tmp/a", "/tmp/b"]})
    )));
    assert!(blocked(&r.judge(
        "s",
        "read_many",
        &json!({"paths": ["/tmp/a", "/etc/hostname"]})
    )));
    // A path that reads as one place and resolves to another cannot be judged.
    let dir = tempfile::tempdir().expect("dir");
    let real = std::fs::canonicalize(dir.path()).expect("real");
    std::fs::create_dir(real.join("secret")).expect("dir");
    std::os::unix::fs::symlink(real.join("secret"), real.join("link")).expect("symlink");
    let r = rules(&format!(
        "      - tool: read_file\n        action: block\n        when:\n          - pointer: /path\n            path_prefix: {}\n",
        real.join("secret").display()
    ));
    let via_link = format!("{}/link/x", real.display());
    assert!(blocked(&r.judge(
        "s",
        "read_file",
        &json!({ "path": via_link })
    )));
    assert!(!blocked(&r.judge(
        "s",
        "read_file",
        &json!({"path": "/tmp/elsewhere"})
    )));
    let etc = rules(ETC);
    assert!(blocked(&etc.judge(
        "s",
        "write_file",
        &json!({"path": "/proc/self/root/etc/passwd"})
    )));
    // Redaction holds when another rule refuses or allows first, and for values it
    // cannot read.
    let r = rules(concat!(
        "      - tool: '*'\n        action: allow\n        when:\n          - pointer: /path\n            path_prefix: /tmp\n",
        "      - tool: run\n        action: block\n        when:\n          - pointer: /cmd\n            regex: 'rm '\n",
        "      - tool: '*'\n        action: redact\n        when:\n          - pointer: /token\n            regex: '.'\n",
    ));
    let refused = r.judge("s", "run", &json!({"cmd": "rm -rf /", "token": "S1"}));
    assert!(
        blocked(&refused) && refused.redact == ["/token"],
        "{refused:?}"
    );
    let allowed = r.judge("s", "echo", &json!({"path": "/tmp/x", "token": "S2"}));
    assert!(
        !blocked(&allowed) && allowed.redact == ["/token"],
        "{allowed:?}"
    );
    let odd = r.judge("s", "echo", &json!({"token": ["S3"]}));
    assert_eq!(odd.redact, ["/token"], "{odd:?}");
    assert_eq!(
        redacted(&json!({"token": ["S3"]}), &odd.redact),
        json!({"token": REDACTED})
    );
}

#[test]
fn a_condition_that_cannot_hold_on_a_declared_schema_is_named() {
    let schema = json!({
        "type": "object",
        "properties": {
            "a": {"type": "number"},
            "path": {"type": "string"},
            "files": {"type": "array", "items": {"type": "string"}}
        },
        "additionalProperties": false
    });
    let condition = |pointer: &str, yaml_test: &str| {
        let yaml = format!("pointer: {pointer}\n{yaml_test}\n");
        serde_yaml_ng::from_str::<ArgumentCondition>(&yaml).expect("condition")
    };
    let why = |c: ArgumentCondition| schema_mismatch(&c, &schema);
    assert!(why(condition("/a", "glob: '*'")).is_some_and(|w| w.contains("declared number")));
    assert!(
        why(condition("/path", "range: {min: 1}")).is_some_and(|w| w.contains("declared string"))
    );
    assert!(why(condition("/nope", "present: true")).is_some_and(|w| w.contains("no property")));
    assert_eq!(why(condition("/a", "range: {min: 1}")), None);
    assert_eq!(why(condition("/files/*", "path_prefix: /etc")), None);
    assert!(why(condition("/files/0", "range: {max: 1}")).is_some());
    // An open schema says nothing about keys it does not list.
    assert_eq!(
        schema_mismatch(
            &condition("/nope", "present: true"),
            &json!({"type": "object"})
        ),
        None
    );
}
