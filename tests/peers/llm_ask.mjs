// One turn of an agent through toolwall's LLM proxy with the official Anthropic TypeScript
// SDK: offers the MCP tools of server `everything` (so tests/peers/fake_llm.py proposes its
// calls) and prints, as one JSON line, the tool calls and text the SDK assembled.
//
// Usage: node llm_ask.mjs PROXY_URL stream|whole
// The SDK comes from $TOOLWALL_PEERS_DIR/node/node_modules (default: target/peers).

import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const peers = process.env.TOOLWALL_PEERS_DIR || path.join(here, "../../target/peers");
const require = createRequire(path.join(peers, "node", "package.json"));
const Anthropic = require("@anthropic-ai/sdk").default;

const [baseURL, mode] = process.argv.slice(2);
const client = new Anthropic({ baseURL, apiKey: "test-key", maxRetries: 0, timeout: 120_000 });
const request = {
  model: "claude-fake",
  max_tokens: 256,
  messages: [{ role: "user", content: "add 1 and 2, and echo hi" }],
  tools: ["get-sum", "echo"].map((t) => ({
    name: `mcp__everything__${t}`,
    description: t,
    input_schema: { type: "object" },
  })),
};
const message = mode === "stream"
  ? await client.messages.stream(request).finalMessage()
  : await client.messages.create(request);
console.log(JSON.stringify({
  tool_calls: message.content.filter((b) => b.type === "tool_use").map((b) => ({ name: b.name, input: b.input })),
  text: message.content.filter((b) => b.type === "text").map((b) => b.text).join(""),
  stop_reason: message.stop_reason,
}));
