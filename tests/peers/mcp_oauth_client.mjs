// An OAuth-authorizing MCP client (the official TypeScript SDK, @modelcontextprotocol/sdk v1:
// `StreamableHTTPClientTransport` with an `authProvider`) for toolwall's tests of protected MCP
// servers, headless. The twin of mcp_oauth_client.py.
//
// Usage: node mcp_oauth_client.mjs URL [--call TOOL [--args JSON]]... [--client-name NAME]
//
// Connects to the Streamable HTTP endpoint URL with no tokens, so the first request is answered
// 401 and the SDK runs the flow (protected resource metadata, authorization server metadata,
// dynamic registration, authorization code with PKCE). No browser: as the conformance suite's
// ConformanceOAuthProvider does, the authorization URL is fetched without following its redirect
// and the code is taken from the `Location` the authorization server answers with (one that asks
// a person to consent cannot be used). The SDK then refuses the first connection with
// UnauthorizedError, as it does for any redirecting provider; `finishAuth` exchanges the code and
// a second connection carries the token. Then lists the tools (all pages) and calls each
// `--call TOOL` with its `--args` object (default {}).
//
// Prints one JSON object on stdout:
//   {"ok": true|false, "url": URL, "tools": [names], "calls": [{"name", "result"} | {"name", "error"}],
//    "http": [{"method", "url", "status"}], "error": message (only when not ok)}
// `http` lists every HTTP exchange this client made, in order of the answers' arrival, with the
// query left off the URL. A tool call answered with a JSON-RPC error is a result, not a failure.
// Exits 1, with the report and the reason on stderr, if connecting, authorizing or listing fails;
// 2 on bad usage.
//
// The SDK comes from $TOOLWALL_PEERS_DIR/conformance/node_modules (default: target/peers), the
// version the conformance suite's reference client runs with.

import { randomBytes } from "node:crypto";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const peers = process.env.TOOLWALL_PEERS_DIR || path.join(here, "../../target/peers");
const require = createRequire(path.join(peers, "conformance", "package.json"));
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");
const { UnauthorizedError } = require("@modelcontextprotocol/sdk/client/auth.js");

// Never listened on: the authorization server's redirect to it is read, not followed.
const REDIRECT_URI = "http://localhost:3000/callback";
const USAGE = "usage: mcp_oauth_client.mjs URL [--call TOOL [--args JSON]]... [--client-name NAME]";

function parseArgs(argv) {
  if (argv.length === 0 || argv[0].startsWith("-")) throw new Error("the URL comes first");
  const out = { url: argv[0], calls: [], clientName: "toolwall-test-oauth-client" };
  for (let i = 1; i < argv.length; i += 2) {
    const [flag, value] = [argv[i], argv[i + 1]];
    if (value === undefined) throw new Error(`${flag} needs a value`);
    if (flag === "--call") {
      out.calls.push([value, {}]);
    } else if (flag === "--args") {
      if (out.calls.length === 0) throw new Error("--args must follow a --call");
      const args = JSON.parse(value);
      if (args === null || typeof args !== "object" || Array.isArray(args)) {
        throw new Error(`--args must be a JSON object, not ${value}`);
      }
      out.calls[out.calls.length - 1][1] = args;
    } else if (flag === "--client-name") {
      out.clientName = value;
    } else {
      throw new Error(`unknown option ${flag}`);
    }
  }
  return out;
}

// Authorization requests and redirects carry codes and state in the query: keep them out of the
// report.
function withoutQuery(url) {
  const u = new URL(String(url));
  u.search = "";
  u.hash = "";
  return u.href;
}

function loggingFetch(exchanges) {
  return async (input, init) => {
    const url = input instanceof Request ? input.url : String(input);
    const method = init?.method ?? (input instanceof Request ? input.method : "GET");
    const response = await fetch(input, init);
    exchanges.push({ method, url: withoutQuery(url), status: response.status });
    return response;
  };
}

// In-memory client registration, tokens and PKCE verifier; the user agent's part of the
// authorization code flow, without a user agent.
class HeadlessOAuthProvider {
  constructor(clientName, fetchFn) {
    this._fetch = fetchFn;
    this._metadata = {
      client_name: clientName,
      redirect_uris: [REDIRECT_URI],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
      token_endpoint_auth_method: "none",
    };
    this._state = undefined;
    this._authCode = undefined;
  }

  get redirectUrl() {
    return REDIRECT_URI;
  }

  get clientMetadata() {
    return this._metadata;
  }

  state() {
    this._state = randomBytes(24).toString("base64url");
    return this._state;
  }

  clientInformation() {
    return this._clientInformation;
  }

  saveClientInformation(info) {
    this._clientInformation = info;
  }

  tokens() {
    return this._tokens;
  }

  saveTokens(tokens) {
    this._tokens = tokens;
  }

  saveCodeVerifier(verifier) {
    this._codeVerifier = verifier;
  }

  codeVerifier() {
    if (!this._codeVerifier) throw new Error("no PKCE code verifier saved");
    return this._codeVerifier;
  }

  async redirectToAuthorization(authorizationUrl) {
    this._authCode = undefined;
    const response = await this._fetch(authorizationUrl.toString(), { redirect: "manual" });
    const location = response.headers.get("location");
    if (!location) {
      const body = (await response.text().catch(() => "")).slice(0, 300);
      throw new Error(
        `the authorization endpoint answered HTTP ${response.status} without a redirect (it may want a person to consent): ${JSON.stringify(body)}`,
      );
    }
    await response.body?.cancel();
    const query = new URL(location, authorizationUrl).searchParams;
    if (query.has("error")) {
      throw new Error(`the authorization server refused: ${query.get("error")} ${query.get("error_description") ?? ""}`);
    }
    if (query.get("state") !== this._state) {
      throw new Error(`state mismatch in the authorization redirect: ${query.get("state")} != ${this._state}`);
    }
    const code = query.get("code");
    if (!code) throw new Error(`no code in the authorization redirect to ${withoutQuery(new URL(location, authorizationUrl))}`);
    this._authCode = code;
  }

  authCode() {
    if (!this._authCode) throw new Error("no authorization code: the redirect did not carry one");
    return this._authCode;
  }
}

async function run({ url, calls, clientName }, out) {
  const fetchFn = loggingFetch(out.http);
  const provider = new HeadlessOAuthProvider(clientName, fetchFn);
  const connect = async () => {
    const transport = new StreamableHTTPClientTransport(new URL(url), { authProvider: provider, fetch: fetchFn });
    const client = new Client({ name: clientName, version: "1.0.0" }, { capabilities: {} });
    try {
      await client.connect(transport);
    } catch (error) {
      await transport.close().catch(() => {});
      throw Object.assign(error, { transport });
    }
    return { client, transport };
  };

  let connection;
  try {
    connection = await connect();
  } catch (error) {
    if (!(error instanceof UnauthorizedError)) throw error;
    // The provider has the code: exchange it, then connect again with the token.
    await error.transport.finishAuth(provider.authCode());
    connection = await connect();
  }
  const { client, transport } = connection;
  try {
    let cursor;
    do {
      const page = await client.listTools(cursor ? { cursor } : undefined);
      out.tools.push(...page.tools.map((t) => t.name));
      cursor = page.nextCursor;
    } while (cursor);
    for (const [name, args] of calls) {
      try {
        out.calls.push({ name, result: await client.callTool({ name, arguments: args }) });
      } catch (error) {
        out.calls.push({ name, error: { code: error.code ?? null, message: error.message ?? String(error) } });
      }
    }
    await transport.terminateSession().catch(() => {});
  } finally {
    await client.close().catch(() => {});
  }
}

let parsed;
try {
  parsed = parseArgs(process.argv.slice(2));
} catch (error) {
  console.error(`mcp_oauth_client.mjs: ${error.message}\n${USAGE}`);
  process.exit(2);
}
const out = { ok: false, url: parsed.url, tools: [], calls: [], http: [] };
try {
  await run(parsed, out);
  out.ok = true;
} catch (error) {
  // fetch() names what went wrong (refused, reset, DNS) only in its cause.
  const cause = error?.cause ? ` (${error.cause.message ?? String(error.cause)})` : "";
  out.error = `${error?.name ?? "Error"}: ${error?.message ?? String(error)}${cause}`;
}
console.log(JSON.stringify(out));
if (!out.ok) {
  console.error(`mcp_oauth_client.mjs: ${parsed.url}: ${out.error}`);
  process.exit(1);
}
process.exit(0);
