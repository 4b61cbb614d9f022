//! What the demo shows of each layer's verdict, and the checks that its verdicts and record are
//! the ones the policy asks for.

use std::net::SocketAddr;

use serde_json::Value;

use super::{ALLOWED_TOOL, DENIED_TOOL, NET_SERVER_ID, SERVER_ID, mcp_name};

/// Whether the kernel layer watched the session, as `toolwall exec` said.
pub(super) enum Kernel {
    /// The session has a cgroup with the programs attached.
    On,
    /// It has none; why, in exec's words.
    Off(String),
}

/// What the demo expected and did not see, and what it could not check.
#[derive(Default)]
pub(super) struct Checks {
    failed: Vec<String>,
    unchecked: Vec<String>,
}

impl Checks {
    pub(super) fn expect(&mut self, held: bool, what: &str) {
        if !held {
            self.failed.push(what.to_owned());
        }
    }

    /// A layer that was off, so nothing of it could be checked.
    pub(super) fn skip(&mut self, what: &str) {
        self.unchecked.push(what.to_owned());
    }

    /// Prints the outcome; whether every expectation held.
    pub(super) fn report(&self) -> bool {
        if self.failed.is_empty() && self.unchecked.is_empty() {
            println!("\nEvery layer did what the policy asks.");
            return true;
        }
        if self.failed.is_empty() {
            println!("\nThe layers that ran did what the policy asks. Not checked:");
            for what in &self.unchecked {
                println!("  - {what}");
            }
            return true;
        }
        println!("\nNOT AS EXPECTED:");
        for what in &self.failed {
            println!("  - {what}");
        }
        false
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

pub(super) fn show_llm(llm: &Value, checks: &mut Checks) {
    println!("\n1. LLM layer: the model's answer, judged by the proxy before the agent reads it");
    if let Some(error) = llm.get("error") {
        println!("   the model could not be asked: {}", text(error));
        checks.expect(false, "the agent asks the model through the LLM proxy");
        return;
    }
    let uses: Vec<String> = llm["tool_uses"]
        .as_array()
        .into_iter()
        .flatten()
        .map(text)
        .collect();
    let texts: Vec<String> = llm["texts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(text)
        .collect();
    for t in &texts {
        println!("   text      {t}");
    }
    for u in &uses {
        println!("   tool_use  {u}  (reached the agent)");
    }
    let allowed = mcp_name(ALLOWED_TOOL);
    let denied = mcp_name(DENIED_TOOL);
    checks.expect(
        uses.contains(&allowed),
        &format!("{allowed} reaches the agent"),
    );
    checks.expect(
        !uses.contains(&denied),
        &format!("{denied} never reaches the agent"),
    );
    let replaced = format!("[toolwall] Tool '{denied}' blocked by policy");
    checks.expect(
        texts.iter().any(|t| t.contains(&replaced)),
        &format!("the agent reads \"{replaced}\" in place of the call"),
    );
}

pub(super) fn show_mcp(mcp: &Value, checks: &mut Checks) {
    println!(
        "\n2. MCP layer: the agent runs the server through `toolwall shim` and calls it directly"
    );
    if let Some(error) = mcp.get("error") {
        println!("   the server could not be reached: {}", text(error));
        checks.expect(false, "the agent reaches the MCP server through the shim");
        return;
    }
    let listed: Vec<String> = mcp["listed"]
        .as_array()
        .into_iter()
        .flatten()
        .map(text)
        .collect();
    println!("   tools/list               {}", listed.join(", "));
    for (tool, key) in [(ALLOWED_TOOL, "allowed"), (DENIED_TOOL, "denied")] {
        let answer = &mcp[key];
        match (answer.get("ok"), answer.get("error")) {
            (Some(ok), _) => println!("   tools/call {tool:<13} ran: {}", text(ok)),
            (_, Some(error)) => println!("   tools/call {tool:<13} REFUSED: {}", text(error)),
            _ => println!("   tools/call {tool:<13} {answer}"),
        }
    }
    checks.expect(
        listed.iter().any(|t| t == ALLOWED_TOOL),
        "the shim lists the allowed tool",
    );
    checks.expect(
        !listed.iter().any(|t| t == DENIED_TOOL),
        "the shim hides the denied tool",
    );
    checks.expect(mcp["allowed"].get("ok").is_some(), "the allowed tool runs");
    checks.expect(
        mcp["denied"].get("error").is_some(),
        "the denied tool is refused",
    );
}

pub(super) fn show_kernel(kernel: &Value, layer: &Kernel, addr: SocketAddr, checks: &mut Checks) {
    println!("\n3. Kernel layer: the agent connects straight to the denied network server");
    let how = if kernel["connected"] == true {
        "connected".to_owned()
    } else {
        format!("failed: {}", text(&kernel["error"]))
    };
    match layer {
        Kernel::Off(why) => {
            println!("   connect {addr}  {how} — the kernel layer is off: {why}");
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } == 0 {
                checks.expect(
                    false,
                    &format!("the kernel layer is on for root (it is off: {why})"),
                );
            } else {
                checks.skip(&format!("the kernel layer (off: {why})"));
            }
        }
        Kernel::On if kernel["refused_by_kernel"] == true => {
            println!(
                "   connect {addr}  REFUSED by the kernel: {}",
                text(&kernel["error"])
            );
        }
        Kernel::On => {
            println!("   connect {addr}  {how}");
            checks.expect(false, "the kernel refuses the connection (EPERM)");
        }
    }
}

/// The records the policy implies, from `toolwall mcp calls --json`; joined across the layers
/// when the session has a cgroup (`kernel_on`).
pub(super) fn check_records(json: &[u8], kernel_on: bool, checks: &mut Checks) {
    let records: Vec<Value> = String::from_utf8_lossy(json)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let has = |server: &str, tool: Option<&str>, kind: &str, action: &str| {
        records.iter().any(|r| {
            r["server_id"] == server
                && tool.is_none_or(|t| r["tool"] == t)
                && r["kind"] == kind
                && r["action"] == action
        })
    };
    if kernel_on {
        checks.expect(
            has(SERVER_ID, Some(ALLOWED_TOOL), "joined", "allow"),
            "the allowed call is one record joined across the LLM and MCP layers",
        );
    } else {
        checks.expect(
            has(SERVER_ID, Some(ALLOWED_TOOL), "intercept_only", "allow")
                && has(SERVER_ID, Some(ALLOWED_TOOL), "execution_only", "allow"),
            "the allowed call is recorded at the LLM layer and as run by the shim",
        );
    }
    checks.expect(
        has(SERVER_ID, Some(DENIED_TOOL), "intercept_only", "block"),
        "the model's denied call is recorded as blocked at the LLM layer",
    );
    checks.expect(
        has(SERVER_ID, Some(DENIED_TOOL), "execution_only", "block"),
        "the agent's direct call of the denied tool is recorded as refused by the shim",
    );
    if kernel_on {
        checks.expect(
            has(NET_SERVER_ID, None, "connection_only", "block"),
            "the refused connection is recorded",
        );
    }
}
