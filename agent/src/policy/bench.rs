//! Micro-benchmarks for `cargo xtask bench` (no `benches/` harness needed): how long one
//! decision takes with many rules. Goal: under 1 µs per `check_call` with 1,000 rules.

use std::{
    hint::black_box,
    sync::Arc,
    time::{Duration, Instant},
};

use serde_json::json;

use super::Policy;
use crate::{
    config::{
        ArgumentAction, ArgumentCondition, ArgumentRule, Config, NumberRange, ServerDecl,
        ServerType, ToolRule,
    },
    decision::{CallQuery, CallStage, Gate},
    registry::Registry,
};

const SERVERS: usize = 20;
const TOOLS_PER_SERVER: usize = 25;

/// Builds a policy with `n_rules` rules (tool rules with globs, a tenth of them `deny:`
/// regexes, at most 100), an in-memory registry of 20 servers × 25 tools, pinning and rate
/// limits on (with a budget no call exhausts), then times `iterations` calls of
/// [`Gate::check_call`] cycling through every name form (bare, `mcp__server__tool`, with the
/// server given, Codex namespace). Returns the mean time of one decision, after one warm-up
/// round (so it measures the steady state: each definition's rule outcome cached).
pub fn bench_decisions(n_rules: usize, iterations: u64) -> Duration {
    let (policy, tools) = setup(n_rules);
    let claude_names: Vec<String> = tools
        .iter()
        .map(|(server, tool)| format!("mcp__{server}__{tool}"))
        .collect();
    let mut queries = Vec::with_capacity(tools.len() * 3);
    for ((server, tool), claude) in tools.iter().zip(&claude_names) {
        queries.push(CallQuery {
            server_id: None,
            name: tool,
            namespace: None,
            stage: CallStage::Proposed,
            arguments: None,
        });
        queries.push(CallQuery {
            server_id: Some(server),
            name: tool,
            namespace: None,
            stage: CallStage::Executing,
            arguments: None,
        });
        queries.push(CallQuery {
            server_id: None,
            name: claude,
            namespace: None,
            stage: CallStage::Proposed,
            arguments: None,
        });
    }
    for query in &queries {
        black_box(policy.check_call(query));
    }
    let start = Instant::now();
    for i in 0..iterations {
        let query = &queries[(i as usize) % queries.len()];
        black_box(policy.check_call(black_box(query)));
    }
    start.elapsed() / u32::try_from(iterations.max(1)).unwrap_or(u32::MAX)
}

/// Like [`bench_decisions`] but without the per-definition cache: the mean time to evaluate
/// the server rules, deny regexes and tool rules for one (server, tool) — what the first
/// call of each newly registered definition costs.
pub fn bench_rule_evaluation(n_rules: usize, iterations: u64) -> Duration {
    let (policy, tools) = setup(n_rules);
    let start = Instant::now();
    for i in 0..iterations {
        let (server, tool) = &tools[(i as usize) % tools.len()];
        black_box(policy.evaluate_static(black_box(server), black_box(tool), ""));
    }
    start.elapsed() / u32::try_from(iterations.max(1)).unwrap_or(u32::MAX)
}

/// Mean time of one [`Gate::check_call`] with the call's `arguments` under `n_arg_rules`
/// argument rules (goal: < 5 µs with 1,000): each tool has a couple of rules of its
/// own (a path prefix, a regex, a range, presence; allow, block and redact), every
/// `global_every`-th rule applies to every tool, and the calls' arguments are judged by all
/// that apply without any holding (the slowest path: every condition evaluated).
pub fn bench_argument_decisions(
    n_arg_rules: usize,
    global_every: usize,
    iterations: u64,
) -> Duration {
    let (policy, tools) = setup_with(0, n_arg_rules, global_every);
    let arguments = json!({
        "path": "/home/user/project/src/../src/main.rs",
        "cmd": "cargo build --release",
        "n": 42,
        "options": {"mode": "0644"}
    });
    let queries: Vec<CallQuery<'_>> = tools
        .iter()
        .map(|(server, tool)| CallQuery {
            server_id: Some(server),
            name: tool,
            namespace: None,
            stage: CallStage::Executing,
            arguments: Some(&arguments),
        })
        .collect();
    for query in &queries {
        black_box(policy.check_call(query));
    }
    let start = Instant::now();
    for i in 0..iterations {
        let query = &queries[(i as usize) % queries.len()];
        black_box(policy.check_call(black_box(query)));
    }
    start.elapsed() / u32::try_from(iterations.max(1)).unwrap_or(u32::MAX)
}

/// The argument rules of [`bench_argument_decisions`]; none of them holds for its calls.
fn argument_rules(n: usize, global_every: usize) -> Vec<ArgumentRule> {
    (0..n)
        .map(|i| {
            let condition = |pointer: &str| ArgumentCondition {
                pointer: pointer.to_owned(),
                glob: None,
                regex: None,
                path_prefix: None,
                range: None,
                present: None,
            };
            let when = match i % 4 {
                0 => vec![ArgumentCondition {
                    path_prefix: Some(format!("/etc/rule{i}")),
                    ..condition("/path")
                }],
                1 => vec![ArgumentCondition {
                    regex: Some(format!("^(rm|dd) .*{i}")),
                    ..condition("/cmd")
                }],
                2 => vec![
                    ArgumentCondition {
                        range: Some(NumberRange {
                            min: Some(1000.0 + i as f64),
                            max: None,
                        }),
                        ..condition("/n")
                    },
                    ArgumentCondition {
                        present: Some(true),
                        ..condition("/options/mode")
                    },
                ],
                _ => vec![ArgumentCondition {
                    glob: Some(format!("**/secret{i}/*")),
                    ..condition("/path")
                }],
            };
            let s = i % SERVERS;
            ArgumentRule {
                name: Some(format!("rule-{i}")),
                server: if i % global_every == 0 {
                    "*".to_owned()
                } else {
                    format!("srv-{s}")
                },
                tool: if i % global_every == 0 {
                    "*".to_owned()
                } else {
                    format!("s{s}_tool_{}", i % TOOLS_PER_SERVER)
                },
                when,
                action: match i % 3 {
                    0 => ArgumentAction::Block,
                    1 => ArgumentAction::Redact,
                    _ => ArgumentAction::Allow,
                },
                reason: None,
            }
        })
        .collect()
}

/// The policy and every registered (server, tool).
fn setup(n_rules: usize) -> (Policy, Vec<(String, String)>) {
    setup_with(n_rules, 0, 1)
}

fn setup_with(
    n_rules: usize,
    n_arg_rules: usize,
    global_every: usize,
) -> (Policy, Vec<(String, String)>) {
    let mut config = Config::default();
    let mcp = &mut config.sandbox.mcp;
    mcp.servers = (0..SERVERS)
        .map(|s| ServerDecl {
            id: format!("srv-{s}"),
            server_type: ServerType::Http,
            command: None,
            args: Vec::new(),
            env: Default::default(),
            cwd: None,
            user: None,
            egress: Vec::new(),
            url: Some(format!("http://127.0.0.1:{}/mcp", 9000 + s)),
            tls_fingerprint: None,
            via_proxy: None,
        })
        .collect();
    let regexes = (n_rules / 10).min(100);
    mcp.deny = (0..regexes).map(|i| format!("^forbidden_{i}_")).collect();
    for i in 0..n_rules.saturating_sub(regexes) {
        let rule = ToolRule {
            server: if i % 3 == 0 {
                "*".to_string()
            } else {
                format!("srv-{}", i % SERVERS)
            },
            tool: format!("denied_{i}_*"),
            content_hash: None,
        };
        if i % 4 == 0 {
            mcp.allowed_tools.push(rule);
        } else {
            mcp.denied_tools.push(rule);
        }
    }
    mcp.argument_rules = argument_rules(n_arg_rules, global_every.max(1));
    mcp.version_pinning.enabled = true;
    mcp.rate_limits.enabled = true;
    mcp.rate_limits.default_rpm = u32::MAX;
    mcp.rate_limits.default_burst = u32::MAX;

    let registry = match Registry::in_memory() {
        Ok(registry) => Arc::new(registry),
        Err(error) => panic!("benchmark setup: in-memory registry: {error}"),
    };
    let policy = match Policy::new(&config, registry, &[]) {
        Ok(policy) => policy,
        Err(error) => panic!("benchmark setup: policy: {error}"),
    };
    let mut names = Vec::new();
    for s in 0..SERVERS {
        let server = format!("srv-{s}");
        let tools: Vec<_> = (0..TOOLS_PER_SERVER)
            .map(|t| {
                // Tool names unique across servers, so bare names resolve.
                json!({
                    "name": format!("s{s}_tool_{t}"),
                    "description": "benchmark tool",
                    "inputSchema": {"type": "object"}
                })
            })
            .collect();
        black_box(policy.check_listed_all(&server, "http", &tools));
        for t in 0..TOOLS_PER_SERVER {
            names.push((server.clone(), format!("s{s}_tool_{t}")));
        }
    }
    (policy, names)
}

/// What the text of [`result_message`] looks like.
#[derive(Clone, Copy, Debug)]
pub enum ResultText {
    /// English prose: its sentence ends (`s.`) wake one rule (`vault-service-token`).
    Prose,
    /// Source code and config text full of `key`, `token`, `password`, `secret`: every rule
    /// those words wake runs over every string, and finds nothing.
    Code,
    /// [`ResultText::Code`] with a secret (AWS, GitHub, generic) in every 4 KiB item: found
    /// and redacted, the message written out again.
    Secrets,
}

/// A `tools/call` result of about `bytes` bytes, its text in 4 KiB content items.
pub fn result_message(bytes: usize, text: ResultText) -> Vec<u8> {
    const PROSE: &[&str] = &[
        "the",
        "report",
        "shows",
        "that",
        "most",
        "builds",
        "finished",
        "within",
        "minutes,",
        "while",
        "a",
        "few",
        "waited",
        "on",
        "the",
        "network.",
        "Results",
        "were",
        "stable",
        "across",
        "runs",
        "and",
        "machines.\n",
    ];
    const CODE: &[&str] = &[
        "let token = parse(&input)?;\n",
        "fn key_for(id: u64) -> String { format!(\"k{id}\") }\n",
        "password_hash: argon2id\n",
        "# rotate the secret every 90 days\n",
        "api_version = 3\n",
        "if auth.is_none() { return Err(Error::Unauthorized); }\n",
        "const MAX_KEYS: usize = 128;\n",
    ];
    const SECRETS: &[&str] = &[
        "aws_access_key_id = AKIAQYLPMN5HHHFPZAM2\n",
        "GITHUB_TOKEN=ghp_4N8mKq2ZxTYvB7wLpR5sD9fJ3hG6cE1aU0iO\n",
        "client_secret: \"x8Kd93LmQz7Vw2Pr5Tn1Ys4Bc6\"\n",
    ];
    let words = match text {
        ResultText::Prose => PROSE,
        ResultText::Code | ResultText::Secrets => CODE,
    };
    let mut items = Vec::new();
    let mut total = 0;
    let mut n = 0usize;
    while total < bytes {
        let mut item = String::with_capacity(4096 + 64);
        if let ResultText::Secrets = text {
            item.push_str(SECRETS[items.len() % SECRETS.len()]);
        }
        while item.len() < 4096 {
            item.push_str(words[n % words.len()]);
            item.push(' ');
            n = n.wrapping_mul(31).wrapping_add(7) % 1009;
        }
        total += item.len() + 32;
        items.push(json!({"type": "text", "text": item}));
    }
    serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": 1, "result": {"content": items}}))
        .unwrap_or_default()
}

/// MB/s of the default result rules (gitleaks' set, redact) on `message`, and MB/s of
/// parsing it into a `serde_json::Value` (what any forwarder that reads results pays), after
/// a warm-up round.
pub fn bench_result_inspection(message: &[u8], iterations: u32) -> (f64, f64) {
    let rules = match super::results::ResultRules::new(&Default::default()) {
        Ok(rules) => rules,
        Err((key, why)) => panic!("the default result rules compile: {key}: {why}"),
    };
    let mbps = |f: &dyn Fn()| {
        f();
        let start = Instant::now();
        for _ in 0..iterations {
            f();
        }
        message.len() as f64 * f64::from(iterations) / start.elapsed().as_secs_f64() / 1e6
    };
    let inspect = mbps(&|| {
        black_box(rules.inspect("bench", Some("read"), black_box(message)));
    });
    let parse = mbps(&|| {
        black_box(serde_json::from_slice::<serde_json::Value>(black_box(message)).ok());
    });
    (inspect, parse)
}
