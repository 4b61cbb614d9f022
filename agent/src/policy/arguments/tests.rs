use serde_json::json;

use super::*;
use crate::config::Config;

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
        Verdict::Pass
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
            matches!(&verdict, Verdict::Block(why) if why.contains("\"no-etc\"") && why.contains("/path is under /etc")),
            "{path}: {verdict:?}"
        );
    }
    // Whole segments only; other tools are not this rule's.
    assert_eq!(
        r.judge("files", "write_file", &json!({"path": "/etcetera/x"})),
        Verdict::Pass
    );
    assert_eq!(
        r.judge("files", "read_file", &json!({"path": "/etc/passwd"})),
        Verdict::Pass
    );
    assert_eq!(r.judge("files", "write_file", &json!({})), Verdict::Pass);
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
            matches!(&verdict, Verdict::Block(why) if why.contains("cannot judge")),
            "{args}: {verdict:?}"
        );
    }
    let allow = rules(
        "      - tool: write_file\n        action: allow\n        when:\n          - pointer: /path\n            path_prefix: /home/u\n      - tool: write_file\n        action: block\n        when:\n          - pointer: /path\n            present: true\n",
    );
    assert_eq!(
        allow.judge("s", "write_file", &json!({"path": "/home/u/notes"})),
        Verdict::Pass
    );
    assert!(matches!(
        allow.judge("s", "write_file", &json!({"path": "notes"})),
        Verdict::Block(_)
    ));
    assert!(matches!(
        allow.judge("s", "write_file", &json!({"path": "/home/u/../v/x"})),
        Verdict::Block(_)
    ));
}

#[test]
fn glob_regex_range_and_presence() {
    let r = rules(concat!(
        "      - server: shell\n        tool: run\n        action: block\n        reason: no package installs\n        when:\n          - pointer: /cmd\n            regex: '^(apt|pip) install'\n",
        "      - tool: write_file\n        action: block\n        when:\n          - pointer: /path\n            glob: '**/*.env'\n",
        "      - tool: transfer\n        action: block\n        when:\n          - pointer: /amount\n            range: { min: 1000 }\n          - pointer: /approved_by\n            present: false\n",
    ));
    let block =
        |s: &str, t: &str, a: serde_json::Value| matches!(r.judge(s, t, &a), Verdict::Block(_));
    assert!(block("shell", "run", json!({"cmd": "pip install x"})));
    assert!(
        matches!(r.judge("shell", "run", &json!({"cmd": "pip install x"})), Verdict::Block(why) if why.ends_with(": no package installs"))
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
    let Verdict::Redact { reason, pointers } = r.judge("s", "search", &args) else {
        panic!("redacted");
    };
    assert!(reason.contains("\"tokens\""), "{reason}");
    assert_eq!(
        redacted(&args, &pointers),
        json!({"token": REDACTED, "q": "x"})
    );
    assert_eq!(r.judge("s", "search", &json!({"q": "x"})), Verdict::Pass);
}

#[test]
fn first_rule_that_holds_decides_and_apply_to_says_which_tools_are_judged() {
    let r = rules(concat!(
        "      - tool: write_file\n        action: allow\n        when:\n          - pointer: /path\n            path_prefix: /tmp\n",
        "      - tool: write_*\n        action: block\n        when:\n          - pointer: /path\n            glob: '/**'\n",
    ));
    assert_eq!(
        r.judge("s", "write_file", &json!({"path": "/tmp/a"})),
        Verdict::Pass
    );
    assert!(matches!(
        r.judge("s", "write_file", &json!({"path": "/var/a"})),
        Verdict::Block(_)
    ));
    assert!(r.apply_to("s", "write_file") && r.apply_to("s", "write_note"));
    assert!(!r.apply_to("s", "read_file"));
    assert!(!ArgumentRules::default().apply_to("s", "write_file"));
}
