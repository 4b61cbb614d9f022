//! Gemini CLI (`@google/gemini-cli`, Gemini API), OpenCode (`opencode-ai`, Anthropic Messages)
//! and Qwen Code (`@qwen-code/qwen-code`, Chat Completions), from npm at the versions pinned
//! in `xtask/peers/package.json`, each under `toolwall exec` with its own MCP configuration and
//! nothing pointed at the proxy by hand: `exec` sets the base URL each reads. Their model is the
//! fake one (`tests/peers/fake_llm.py`), which asks for `echo` (allowed) and `get-sum` (denied)
//! in each agent's own naming. Shown from what each agent sent back to its model and from
//! `toolwall mcp calls`: the allowed call ran through the shim and is joined across layers, the
//! denied one was replaced at the LLM layer and never ran.

mod agents_common;

use std::path::Path;

use agents_common::*;
use serde_json::{Value, json};
use toolwall_tests::{Daemon, is_root, toolwall_bin};

const PROMPT: &str = "Call the echo tool with message hi, and get-sum of 1 and 2.";

/// The agent's requests to its model on `route` (a path ending), in order.
fn turns(requests: &[Value], route: &str) -> Vec<Value> {
    requests
        .iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .unwrap_or("")
                .split('?')
                .next()
                .is_some_and(|p| p.ends_with(route))
        })
        .cloned()
        .collect()
}

/// The shim command (`toolwall shim … -- server-everything stdio`) as a JSON command line.
fn shim_command(daemon: &Daemon) -> Value {
    json!({"command": toolwall_bin(), "args": shim_args(daemon)})
}

/// The agent asked its model twice through the proxy; its last turn carries the echo's answer
/// and the LLM layer's text for get-sum (named `blocked`), and offers no get-sum (the shim hid
/// it); the record joins echo across layers and shows get-sum refused, never run.
fn assert_run(daemon: &Daemon, session: &str, turns: &[Value], blocked: &str, llm_layer: &str) {
    assert!(
        turns.len() >= 2,
        "{session} reached the model through the proxy, twice: {turns:#?}"
    );
    let last = turns.last().expect("a turn").to_string();
    assert!(last.contains("Echo: hi"), "{last}");
    assert!(
        last.contains(&format!("[toolwall] Tool '{blocked}' blocked by policy")),
        "{last}"
    );
    assert!(
        !turns[0]["json"]["tools"].to_string().contains("get-sum"),
        "the shim hid the denied tool"
    );
    assert_calls(&calls(daemon, session), llm_layer);
}

#[test]
#[ignore = "privileged: needs root (session cgroups); `cargo xtask test` runs it as root"]
fn privileged_gemini_cli_under_exec_runs_allowed_tools_and_never_sees_denied_ones() {
    assert!(is_root());
    let home = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start(home.path());
    let mut daemon = daemon(&llm.url);
    // Gemini CLI reads GOOGLE_GEMINI_BASE_URL only with an API key sign-in.
    let settings = json!({
        "security": {"auth": {"selectedType": "gemini-api-key"}},
        "privacy": {"usageStatisticsEnabled": false},
        "general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false},
        "mcpServers": {"everything": shim_command(&daemon)},
    });
    std::fs::create_dir_all(home.path().join(".gemini")).unwrap();
    std::fs::write(
        home.path().join(".gemini/settings.json"),
        settings.to_string(),
    )
    .unwrap();
    let args = [
        "-p",
        PROMPT,
        // Without it, MCP tools are not offered in non-interactive mode.
        "--yolo",
        "--skip-trust",
        // A model named: no routing request first.
        "-m",
        "gemini-2.5-flash",
    ]
    .map(str::to_owned);
    let out = exec(
        &daemon,
        "gemini",
        home.path(),
        &[
            ("GEMINI_API_KEY", "AIza-test"),
            ("GEMINI_CLI_NO_RELAUNCH", "true"),
        ],
        &agent_bin("gemini"),
        &args,
    );
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("GOOGLE_GEMINI_BASE_URL") && !stderr.contains("signs in as"),
        "exec said how Gemini CLI is covered: {stderr}"
    );
    let turns = turns(&llm.requests(), ":streamGenerateContent");
    assert_run(
        &daemon,
        "gemini",
        &turns,
        "mcp_everything_get-sum",
        "llm/gemini",
    );
    assert!(daemon.stop().success());
}

#[test]
#[ignore = "privileged: needs root (session cgroups); `cargo xtask test` runs it as root"]
fn privileged_opencode_under_exec_runs_allowed_tools_and_never_sees_denied_ones() {
    assert!(is_root());
    let home = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start(home.path());
    let mut daemon = daemon(&llm.url);
    let mut command = vec![Value::from(toolwall_bin().display().to_string())];
    command.extend(shim_args(&daemon).into_iter().map(Value::from));
    // Named by OPENCODE_CONFIG: OpenCode takes its project from $PWD, which is the test's.
    let config = home.path().join("opencode.json");
    std::fs::write(
        &config,
        json!({"mcp": {"everything": {"type": "local", "command": command}}}).to_string(),
    )
    .unwrap();
    let config = config.display().to_string();
    let args = [
        "run",
        "--pure",
        "-m",
        "anthropic/claude-sonnet-4-5",
        // A title given: no title-generation request first.
        "--title",
        "e2e",
        PROMPT,
    ]
    .map(str::to_owned);
    let out = exec(
        &daemon,
        "opencode",
        home.path(),
        &[
            ("ANTHROPIC_API_KEY", "sk-ant-test"),
            ("OPENCODE_CONFIG", &config),
            // Its built-in model list, not models.dev; no self-update; its plugin install
            // fails at once instead of reaching for the npm registry.
            ("OPENCODE_DISABLE_MODELS_FETCH", "true"),
            ("OPENCODE_DISABLE_AUTOUPDATE", "true"),
            ("npm_config_registry", "http://127.0.0.1:9/"),
        ],
        &agent_bin("opencode"),
        &args,
    );
    assert!(out.status.success());
    let turns = turns(&llm.requests(), "/v1/messages");
    assert_run(
        &daemon,
        "opencode",
        &turns,
        "everything_get-sum",
        "llm/anthropic",
    );
    assert!(daemon.stop().success());
}

/// Qwen Code under `exec` with `server` as its MCP server; the daemon and its model turns.
fn run_qwen(home: &Path, llm: &FakeLlm, session: &str, alone: bool) -> (Daemon, Vec<Value>) {
    let daemon = daemon(&llm.url);
    let mut server = shim_command(&daemon);
    if alone {
        server["alwaysLoadTools"] = json!(true);
    }
    write_qwen_settings(home, server);
    let out = exec(
        &daemon,
        session,
        home,
        QWEN_QUIET,
        &agent_bin("qwen"),
        &["--yolo".to_owned(), PROMPT.to_owned()],
    );
    assert!(out.status.success());
    (daemon, turns(&llm.requests(), "/v1/chat/completions"))
}

/// Qwen Code with the server's tools offered by name (`alwaysLoadTools`); its default, a
/// dispatcher tool, is the next test's.
#[test]
#[ignore = "privileged: needs root (session cgroups); `cargo xtask test` runs it as root"]
fn privileged_qwen_code_under_exec_runs_allowed_tools_and_never_sees_denied_ones() {
    assert!(is_root());
    let home = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start(home.path());
    let (mut daemon, turns) = run_qwen(home.path(), &llm, "qwen", true);
    assert_run(
        &daemon,
        "qwen",
        &turns,
        "mcp__everything__get-sum",
        "llm/openai-chat",
    );
    assert!(daemon.stop().success());
}

/// Qwen Code as it comes: the server's tools offered through its dispatcher, `tool_call
/// {"name", "arguments"}`, which the LLM layer judges as the call it names.
#[test]
#[ignore = "privileged: needs root (session cgroups); `cargo xtask test` runs it as root"]
fn privileged_qwen_codes_dispatcher_is_judged_as_the_call_it_makes() {
    assert!(is_root());
    let home = tempfile::tempdir().unwrap();
    let llm = FakeLlm::start(home.path());
    let (mut daemon, turns) = run_qwen(home.path(), &llm, "qwen-bridge", false);
    assert!(
        turns[0]["json"]["tools"]
            .to_string()
            .contains("\"tool_call\""),
        "Qwen Code offered its dispatcher"
    );
    assert_run(
        &daemon,
        "qwen-bridge",
        &turns,
        "tool_call",
        "llm/openai-chat",
    );
    assert!(daemon.stop().success());
}

/// Qwen Code's environment: its key and model (it starts only with both), no usage statistics.
const QWEN_QUIET: &[(&str, &str)] = &[
    ("OPENAI_API_KEY", "sk-test"),
    ("OPENAI_MODEL", "fake-model"),
    ("QWEN_CODE_SUPPRESS_YOLO_WARNING", "1"),
    ("QWEN_USAGE_STATISTICS_ENABLED", "false"),
];

fn write_qwen_settings(home: &Path, server: Value) {
    let settings = json!({
        "privacy": {"usageStatisticsEnabled": false},
        "general": {"enableAutoUpdate": false},
        "memory": {"enableManagedAutoMemory": false},
        "mcpServers": {"everything": server},
    });
    std::fs::create_dir_all(home.join(".qwen")).unwrap();
    std::fs::write(home.join(".qwen/settings.json"), settings.to_string()).unwrap();
}
