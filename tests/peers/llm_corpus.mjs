// Replays a corpus of hostile upstream responses through toolwall's LLM proxy to the official
// TypeScript SDKs (@anthropic-ai/sdk, openai), and reports which tool calls each SDK call
// assembled (or the error it threw). The twin of llm_corpus.py: same arguments, same cases
// (the case format, every `sdk` kind and what each reads the calls from are described there),
// same report.
//
// Usage: node llm_corpus.mjs UPSTREAM_PORT PROXY_URL CASE.json...
//
// It starts its own fake upstream on UPSTREAM_PORT (run it after the Python peer, not beside
// it). The SDKs come from $TOOLWALL_PEERS_DIR/node/node_modules (default: target/peers).
// Every case runs twice: direct (the SDK against the fake upstream: proves the case is an
// attack the SDK would act on) and through the proxy. The fake upstream answers every request
// with the current case; a request to any path that contains "-x" (a redirect's target) gets
// the case's "then", a path named in the case's "routes" its answer there. A case's "chunks"
// ([[delay_ms, text], ...]) are sent one by one after their delays instead of "body";
// "{upstream}" in a body or chunk becomes the fake upstream's own URL.
//
// sdk kinds: anthropic.create, anthropic.stream, chat.create, chat.stream, responses.create,
// responses.stream, anthropic.sessions.events.stream (beta.sessions.events.stream: Managed
// Agents SSE), anthropic.sessions.events.list, anthropic.batches.results
// (messages.batches.results), chatkit.threads.list_items (beta.chatkit.threads.listItems),
// assistants.runs.retrieve (beta.threads.runs.retrieve).

import { readFileSync } from "node:fs";
import http from "node:http";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const peers = process.env.TOOLWALL_PEERS_DIR || path.join(here, "../../target/peers");
const require = createRequire(path.join(peers, "node", "package.json"));
const Anthropic = require("@anthropic-ai/sdk").default;
const OpenAI = require("openai").default;
const { GoogleGenAI } = require("@google/genai");

let current = null;
let upstream = null;

const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms));

const server = http.createServer((req, res) => {
  req.resume();
  req.on("end", async () => {
    const routes = current.routes ?? {};
    const reqPath = req.url.split("?")[0];
    const c = Object.hasOwn(routes, reqPath)
      ? routes[reqPath]
      : req.url.includes("-x") && current.then
        ? current.then
        : current;
    const fill = (text) => Buffer.from(text.replaceAll("{upstream}", upstream));
    if (c.chunks) {
      // No content-length: node sends each write as one chunk of the chunked transfer coding.
      res.writeHead(c.status ?? 200, c.headers ?? {});
      for (const [delayMs, text] of c.chunks) {
        await sleep(delayMs);
        res.write(fill(text));
      }
      res.end();
      return;
    }
    const body = fill(c.body);
    res.writeHead(c.status ?? 200, { ...(c.headers ?? {}), "content-length": body.length });
    res.end(body);
  });
});

const callsAnthropic = (message) =>
  message.content
    .filter((b) => ["tool_use", "server_tool_use", "mcp_tool_use"].includes(b.type))
    .map((b) => b.name);

function callsChat(completion) {
  const out = [];
  for (const ch of completion.choices) {
    const m = ch.message;
    for (const tc of m.tool_calls ?? []) {
      if (tc.type === "function") out.push(tc.function.name);
      else if (tc.type === "custom") out.push(tc.custom.name);
    }
    if (m.function_call) out.push(m.function_call.name);
  }
  return out;
}

const callsResponses = (response) =>
  response.output
    .filter((i) => ["function_call", "custom_tool_call", "mcp_call"].includes(i.type))
    .map((i) => i.name);

const callsSessionEvents = (events) =>
  events
    .filter((e) => ["agent.custom_tool_use", "agent.mcp_tool_use", "agent.tool_use"].includes(e.type))
    .map((e) => e.name);

function callsBatchResults(results) {
  const out = [];
  for (const r of results) {
    if (r.result.type === "succeeded") out.push(...callsAnthropic(r.result.message));
  }
  return out;
}

const callsChatkitItems = (items) =>
  items.filter((i) => i.type === "chatkit.client_tool_call").map((i) => i.name);

const callsGemini = (response) =>
  (response.candidates ?? []).flatMap((c) =>
    (c.content?.parts ?? []).filter((p) => p.functionCall).map((p) => p.functionCall.name),
  );

const callsRun = (run) =>
  (run.required_action?.submit_tool_outputs.tool_calls ?? []).map((tc) => tc.function.name);

// Every item of an async iterable: an SDK stream, a JSONL decoder, an auto-paginating list.
async function collect(iterable) {
  const out = [];
  for await (const x of iterable) out.push(x);
  return out;
}

async function drain(stream) {
  for await (const _ of stream);
}

const gemini = (base) =>
  new GoogleGenAI({ apiKey: "AIza-test", httpOptions: { baseUrl: base, retryOptions: { attempts: 1 } } });

async function run(c, base) {
  const a = new Anthropic({ baseURL: base, apiKey: "sk-test", maxRetries: 0 });
  const o = new OpenAI({ baseURL: base + "/v1", apiKey: "sk-test", maxRetries: 0 });
  const messages = [{ role: "user", content: "go" }];
  switch (c.sdk) {
    case "anthropic.create":
      return callsAnthropic(await a.messages.create({ model: "claude", max_tokens: 10, messages }));
    case "anthropic.stream": {
      const s = a.messages.stream({ model: "claude", max_tokens: 10, messages });
      await drain(s);
      return callsAnthropic(await s.finalMessage());
    }
    case "chat.create":
      return callsChat(await o.chat.completions.create({ model: "gpt", messages }));
    case "chat.stream": {
      const s = o.chat.completions.stream({ model: "gpt", messages });
      await drain(s);
      return callsChat(await s.finalChatCompletion());
    }
    case "responses.create":
      return callsResponses(await o.responses.create({ model: "gpt", input: "go" }));
    case "responses.stream": {
      const s = o.responses.stream({ model: "gpt", input: "go" });
      await drain(s);
      return callsResponses(await s.finalResponse());
    }
    case "anthropic.sessions.events.stream":
      return callsSessionEvents(await collect(await a.beta.sessions.events.stream("sesn_1")));
    case "anthropic.sessions.events.list":
      return callsSessionEvents(await collect(a.beta.sessions.events.list("sesn_1")));
    case "anthropic.batches.results":
      return callsBatchResults(await collect(await a.messages.batches.results("msgbatch_1")));
    case "chatkit.threads.list_items":
      return callsChatkitItems(await collect(o.beta.chatkit.threads.listItems("cthr_1")));
    case "assistants.runs.retrieve":
      return callsRun(await o.beta.threads.runs.retrieve("run_1", { thread_id: "thread_1" }));
    case "gemini.create":
      return callsGemini(
        await gemini(base).models.generateContent({ model: "gemini-2.5-flash", contents: "go" }),
      );
    case "gemini.stream": {
      const out = [];
      const s = await gemini(base).models.generateContentStream({
        model: "gemini-2.5-flash",
        contents: "go",
      });
      for await (const chunk of s) out.push(...callsGemini(chunk));
      return out;
    }
    default:
      throw new Error(`unknown sdk ${JSON.stringify(c.sdk)}`);
  }
}

const [port, base, ...files] = process.argv.slice(2);
upstream = `http://127.0.0.1:${port}`;
await new Promise((ok) => server.listen(Number(port), "127.0.0.1", ok));
const report = {};
for (const file of files) {
  current = JSON.parse(readFileSync(file, "utf8"));
  report[file] = {};
  for (const [label, url] of [["direct", `http://127.0.0.1:${port}`], ["proxied", base]]) {
    try {
      report[file][label] = { calls: await run(current, url), error: null };
    } catch (e) {
      // an SDK error is a refusal, never a call
      report[file][label] = {
        calls: [],
        error: `${e?.constructor?.name}: ${e?.message ?? e}`.slice(0, 300),
        status: e?.status ?? null,
      };
    }
  }
}
console.log(JSON.stringify(report));
server.closeAllConnections();
server.close();
