// Drives the daemon's web view in headless Chromium: loads the page, waits until it is live,
// records calls through the API, waits for their rows to appear, opens one, and prints what it
// saw as JSON on stdout (the Rust test asserts on it). Args: API address, screenshot path.
const path = require("path");
const { chromium } = require(path.join(process.env.PEERS_NODE, "node_modules", "playwright-core"));

const [api, screenshot] = process.argv.slice(2);
const base = `http://${api}`;

function event(type, fields) {
  return JSON.stringify({ type, timestamp: new Date().toISOString(), session_id: "web", server_id: "everything", ...fields });
}

(async () => {
  const browser = await chromium.launch({
    executablePath: "/usr/bin/chromium",
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  try {
    const page = await browser.newPage();
    await page.goto(base + "/");
    await page.waitForFunction(() => document.getElementById("status").textContent === "live", null, { timeout: 10000 });
    const intercepted = (tool, action, reason) => event("mcp_tool_call_intercepted", {
      request_id: "r1", dialect: "anthropic", tool_name: `mcp__everything__${tool}`, tool_call_id: "toolu_" + tool,
      input: { message: tool }, server_type: "stdio", server_addr: "", tool_hash: "", action, reason,
    });
    const called = (tool) => event("mcp_tool_called", {
      server_type: "stdio", tool_name: tool, jsonrpc_id: 1, input: { message: tool }, action: "allow", reason: "", layer: "shim",
    });
    const body = [intercepted("echo", "allow", ""), called("echo"), intercepted("printEnv", "block", "tool denied by deny regex")].join("\n");
    const posted = await fetch(base + "/api/events", { method: "POST", body });
    if (posted.status !== 202) throw new Error("POST /api/events: " + posted.status);
    await page.waitForFunction(() => document.querySelectorAll("#rows tr").length >= 2, null, { timeout: 10000 });
    const rows = await page.$$eval("#rows tr", trs => trs.map(tr => [...tr.children].map(td => td.textContent)));
    await page.click("#rows tr");
    await page.waitForFunction(() => document.getElementById("detail").textContent.includes("LLM layer"), null, { timeout: 10000 });
    await page.waitForFunction(() => !document.getElementById("detail").textContent.includes("loading"), null, { timeout: 10000 });
    const detail = await page.textContent("#detail");
    await page.screenshot({ path: screenshot, fullPage: true });
    console.log(JSON.stringify({ rows, detail }));
  } finally {
    await browser.close();
  }
})().catch(e => { console.error(e); process.exit(1); });
