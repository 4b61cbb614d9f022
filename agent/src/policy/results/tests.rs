use super::*;
use crate::config::{ResultExemption, ResultPattern};

const AWS: &str = "AKIAQYLPMN5HHHFPZAM2";

fn rules(config: ResultInspectionConfig) -> ResultRules {
    ResultRules::new(&config).expect("compiles")
}

fn response(text: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "jsonrpc": "2.0", "id": 7,
        "result": {"content": [{"type": "text", "text": text}], "isError": false}
    }))
    .expect("serialises")
}

fn text_of(message: &[u8]) -> String {
    let v: Value = serde_json::from_slice(message).expect("JSON");
    v["result"]["content"][0]["text"]
        .as_str()
        .expect("text")
        .to_owned()
}

#[test]
fn a_secret_is_redacted_where_it_stands_and_recorded_by_place() {
    let rules = rules(ResultInspectionConfig::default());
    let message = response(&format!("id: {AWS}\nbye"));
    let verdict = rules
        .inspect("s3", Some("read"), &message)
        .expect("a finding");
    assert_eq!(verdict.action, ResultAction::Redact);
    assert_eq!(verdict.total, 1);
    let finding = &verdict.findings[0];
    assert_eq!(
        (
            finding.rule.as_str(),
            finding.kind.as_str(),
            finding.pointer.as_str()
        ),
        ("aws-access-token", "secret", "/result/content/0/text")
    );
    assert_eq!((finding.start, finding.end), (4, 24));
    let redacted = verdict.redacted.expect("a redacted message");
    assert_eq!(
        text_of(&redacted),
        "id: [toolwall:redacted:aws-access-token]\nbye"
    );
    // Neither the message forwarded nor the verdict's record holds the secret.
    assert!(!String::from_utf8_lossy(&redacted).contains(AWS));
    assert!(!format!("{:?}", verdict.findings).contains(AWS) && !verdict.reason.contains(AWS));
}

#[test]
fn escaped_text_is_judged_as_the_client_reads_it() {
    let rules = rules(ResultInspectionConfig::default());
    // `\u0041KIA…`: no keyword in the raw bytes, AKIA once decoded.
    let message = format!(
        r#"{{"jsonrpc":"2.0","id":1,"result":{{"content":[{{"type":"text","text":"\u0041{}"}}]}}}}"#,
        &AWS[1..]
    );
    let verdict = rules.inspect("s", None, message.as_bytes()).expect("found");
    assert_eq!(verdict.findings[0].rule, "aws-access-token");
}

#[test]
fn a_message_without_findings_passes_unparsed() {
    let rules = rules(ResultInspectionConfig::default());
    assert_eq!(rules.inspect("s", None, &response("all quiet here")), None);
    // Not even parsed: bytes that are no JSON at all pass the prefilter untouched.
    assert_eq!(rules.inspect("s", None, b"plain words"), None);
}

#[test]
fn patterns_withhold_alert_and_the_strongest_decides() {
    let rules = rules(ResultInspectionConfig {
        secrets: ResultAction::Alert,
        patterns: vec![ResultPattern {
            name: "internal-host".into(),
            regex: r"\b[a-z0-9-]+\.corp\.example\b".into(),
            action: ResultAction::Withhold,
        }],
        exempt: Vec::new(),
    });
    let only_secret = rules
        .inspect("s", None, &response(&format!("id {AWS}")))
        .expect("found");
    assert_eq!(only_secret.action, ResultAction::Alert);
    assert_eq!(only_secret.redacted, None);
    let both = rules
        .inspect("s", None, &response(&format!("{AWS} on db1.corp.example")))
        .expect("found");
    assert_eq!(both.action, ResultAction::Withhold);
    assert_eq!(both.total, 2);
    assert!(
        both.findings
            .iter()
            .any(|f| f.rule == "internal-host" && f.kind == "pattern")
    );
}

#[test]
fn exemptions_apply_to_the_named_tool_only() {
    let rules = rules(ResultInspectionConfig {
        secrets: ResultAction::Redact,
        patterns: vec![ResultPattern {
            name: "ticket".into(),
            regex: r"TICKET-[0-9]+".into(),
            action: ResultAction::Redact,
        }],
        exempt: vec![
            ResultExemption {
                server: "aws".into(),
                tool: "presign_*".into(),
                rules: Vec::new(),
            },
            ResultExemption {
                server: "*".into(),
                tool: "tickets".into(),
                rules: vec!["ticket".into()],
            },
        ],
    });
    let message = response(&format!("{AWS} TICKET-12"));
    assert_eq!(rules.inspect("aws", Some("presign_url"), &message), None);
    // Another server's tool of that name, or a message the layer could not tie to a call.
    assert!(
        rules
            .inspect("other", Some("presign_url"), &message)
            .is_some()
    );
    assert!(rules.inspect("aws", None, &message).is_some());
    let partly = rules
        .inspect("x", Some("tickets"), &message)
        .expect("found");
    assert_eq!(
        text_of(&partly.redacted.expect("redacted")),
        "[toolwall:redacted:aws-access-token] TICKET-12"
    );
}

#[test]
fn an_exemption_naming_no_rule_is_refused() {
    let error = ResultRules::new(&ResultInspectionConfig {
        exempt: vec![ResultExemption {
            server: "*".into(),
            tool: "t".into(),
            rules: vec!["aws-acess-token".into()],
        }],
        ..Default::default()
    })
    .expect_err("a typo");
    assert_eq!(error.0, "exempt[0].rules");
    assert!(error.1.contains("aws-acess-token"), "{}", error.1);
}

#[test]
fn overlapping_findings_are_one_redaction_and_findings_are_bounded() {
    let rules = rules(ResultInspectionConfig {
        secrets: ResultAction::Off,
        patterns: vec![
            ResultPattern {
                name: "abc".into(),
                regex: "abc".into(),
                action: ResultAction::Redact,
            },
            ResultPattern {
                name: "bcd".into(),
                regex: "bcd".into(),
                action: ResultAction::Redact,
            },
        ],
        exempt: Vec::new(),
    });
    let verdict = rules
        .inspect("s", None, &response("xabcdy"))
        .expect("found");
    assert_eq!(
        text_of(&verdict.redacted.expect("redacted")),
        "x[toolwall:redacted:abc]y"
    );
    let many = rules
        .inspect("s", None, &response(&"abc ".repeat(1000)))
        .expect("found");
    assert_eq!(many.total, 1000);
    assert_eq!(many.findings.len(), ResultVerdict::MAX_FINDINGS);
}

#[test]
fn keys_and_pointers_are_escaped() {
    let rules = rules(ResultInspectionConfig::default());
    let message = serde_json::to_vec(&serde_json::json!({
        "jsonrpc": "2.0", "method": "notifications/message",
        "params": {"data": {"a/b~c": [AWS]}}
    }))
    .expect("serialises");
    let verdict = rules.inspect("s", None, &message).expect("found");
    assert_eq!(verdict.findings[0].pointer, "/params/data/a~1b~0c/0");
}

#[test]
fn a_message_too_deep_to_read_is_withheld_unless_rules_only_alert() {
    let deep = format!("{}\"{AWS}\"{}", "[".repeat(200), "]".repeat(200));
    let verdict = rules(ResultInspectionConfig::default())
        .inspect("s", None, deep.as_bytes())
        .expect("fail closed");
    assert_eq!(verdict.action, ResultAction::Withhold);
    let alerting = rules(ResultInspectionConfig {
        secrets: ResultAction::Alert,
        ..Default::default()
    });
    let verdict = alerting.inspect("s", None, deep.as_bytes()).expect("alert");
    assert_eq!(verdict.action, ResultAction::Alert);
    assert_eq!(verdict.redacted, None);
}

#[test]
fn a_key_holding_a_secret_is_redacted_and_never_named_in_the_record() {
    let rules = rules(ResultInspectionConfig::default());
    let message = format!(
        r#"{{"jsonrpc":"2.0","id":1,"result":{{"structuredContent":{{"{AWS}":"v","[toolwall:redacted:aws-access-token]":"w"}}}}}}"#
    );
    let verdict = rules.inspect("s", None, message.as_bytes()).expect("found");
    let finding = &verdict.findings[0];
    assert!(finding.in_key);
    assert_eq!(
        finding.pointer,
        "/result/structuredContent/[toolwall:redacted]"
    );
    let redacted = String::from_utf8(verdict.redacted.expect("redacted")).expect("utf8");
    assert!(!redacted.contains(AWS), "{redacted}");
    // Both values kept: the redacted key does not overwrite the one spelled like it.
    let v: Value = serde_json::from_str(&redacted).expect("JSON");
    assert_eq!(
        v["result"]["structuredContent"]
            .as_object()
            .map(|m| m.len()),
        Some(2)
    );
}

#[test]
fn an_id_holding_a_secret_is_said() {
    let rules = rules(ResultInspectionConfig::default());
    let message = format!(r#"{{"jsonrpc":"2.0","id":"{AWS}","method":"ping"}}"#);
    let verdict = rules.inspect("s", None, message.as_bytes()).expect("found");
    assert!(verdict.id_holds_finding);
    let quiet = rules
        .inspect("s", None, &response(&format!("x {AWS}")))
        .expect("found");
    assert!(!quiet.id_holds_finding);
}

#[test]
fn patterns_see_numbers() {
    let rules = rules(ResultInspectionConfig {
        secrets: ResultAction::Off,
        patterns: vec![ResultPattern {
            name: "card".into(),
            regex: "^4[0-9]{15}$".into(),
            action: ResultAction::Redact,
        }],
        exempt: Vec::new(),
    });
    let message =
        br#"{"jsonrpc":"2.0","id":1,"result":{"structuredContent":{"card":4111111111111111}}}"#;
    let verdict = rules.inspect("s", None, message).expect("found");
    let v: Value = serde_json::from_slice(&verdict.redacted.expect("redacted")).expect("JSON");
    assert_eq!(
        v["result"]["structuredContent"]["card"],
        "[toolwall:redacted:card]"
    );
}

#[test]
fn past_the_bound_of_findings_a_message_is_withheld_whole() {
    let rules = rules(ResultInspectionConfig::default());
    let many = format!("{AWS} ").repeat(MAX_MESSAGE_FINDINGS + 10);
    let verdict = rules.inspect("s", None, &response(&many)).expect("found");
    assert_eq!(verdict.action, ResultAction::Withhold);
    assert!(
        verdict.reason.contains("stopped looking"),
        "{}",
        verdict.reason
    );
    assert!(verdict.total <= MAX_MESSAGE_FINDINGS + 1);
    // Under alert-only rules the bound alerts.
    let alerting = rules_alerting();
    let verdict = alerting
        .inspect("s", None, &response(&many))
        .expect("found");
    assert_eq!(verdict.action, ResultAction::Alert);
}

fn rules_alerting() -> ResultRules {
    rules(ResultInspectionConfig {
        secrets: ResultAction::Alert,
        ..Default::default()
    })
}
