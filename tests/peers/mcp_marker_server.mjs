// An MCP server (the official TypeScript SDK, @modelcontextprotocol/sdk, default settings) for
// the hostile-client corpus: it tells from the server's side which tools actually ran. The twin
// of mcp_marker_server.py.
//
// Usage: node mcp_marker_server.mjs stdio | http PORT | express PORT
//
// Tools: `secret` (the one the tests deny) and `harmless`. Every run of a tool appends
// `<tool name>\n` to the file named by $TOOLWALL_MARKER (flushed and fsynced) before it answers.
// Over HTTP it serves Streamable HTTP (stateful, one transport per session, as the SDK's
// examples do) at http://127.0.0.1:PORT/mcp; `express` serves it stateless behind express.json()
// as the SDK's README shows (body-parser decodes the body in the charset `Content-Type` names).
// The SDK comes from
// $TOOLWALL_PEERS_DIR/node/node_modules (default: target/peers).

import { randomUUID } from "node:crypto";
import { closeSync, fsyncSync, openSync, writeSync } from "node:fs";
import http from "node:http";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const peers = process.env.TOOLWALL_PEERS_DIR || path.join(here, "../../target/peers");
const require = createRequire(path.join(peers, "node", "package.json"));
const { McpServer } = require("@modelcontextprotocol/sdk/server/mcp.js");
const { StdioServerTransport } = require("@modelcontextprotocol/sdk/server/stdio.js");
const { StreamableHTTPServerTransport } = require("@modelcontextprotocol/sdk/server/streamableHttp.js");

const markerFile = process.env.TOOLWALL_MARKER;
if (!markerFile) {
  console.error("TOOLWALL_MARKER must name the marker file");
  process.exit(2);
}

function mark(name) {
  const fd = openSync(markerFile, "a");
  try {
    writeSync(fd, `${name}\n`);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

function newServer() {
  const server = new McpServer({ name: "toolwall-marker", version: "1.0.0" });
  for (const [name, description] of [
    ["secret", "The tool every test denies."],
    ["harmless", "The control: a tool every test allows."],
  ]) {
    server.registerTool(name, { description }, async () => {
      mark(name);
      return { content: [{ type: "text", text: `${name} ran` }] };
    });
  }
  return server;
}

const [mode, port] = process.argv.slice(2);
if (mode === "stdio") {
  await newServer().connect(new StdioServerTransport());
} else if (mode === "http" && port) {
  const sessions = new Map();
  const httpServer = http.createServer(async (req, res) => {
    try {
      const id = req.headers["mcp-session-id"];
      let transport = typeof id === "string" ? sessions.get(id) : undefined;
      if (!transport) {
        if (id !== undefined || req.method !== "POST") {
          res.writeHead(id === undefined ? 400 : 404, { "content-type": "application/json" });
          res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message: "no such session" }, id: null }));
          return;
        }
        // A new session: the transport itself checks that this is an initialize request.
        transport = new StreamableHTTPServerTransport({
          sessionIdGenerator: () => randomUUID(),
          onsessioninitialized: (sid) => sessions.set(sid, transport),
        });
        transport.onclose = () => transport.sessionId && sessions.delete(transport.sessionId);
        await newServer().connect(transport);
      }
      await transport.handleRequest(req, res);
    } catch (e) {
      console.error(e);
      if (!res.headersSent) res.writeHead(500);
      res.end();
    }
  });
  httpServer.listen(Number(port), "127.0.0.1");
} else if (mode === "express" && port) {
  const express = require("express");
  const app = express();
  app.use(express.json());
  app.post("/mcp", async (req, res) => {
    const server = newServer();
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined });
    res.on("close", () => {
      transport.close();
      server.close();
    });
    await server.connect(transport);
    await transport.handleRequest(req, res, req.body);
  });
  app.listen(Number(port), "127.0.0.1");
} else {
  console.error("usage: node mcp_marker_server.mjs stdio | http PORT | express PORT");
  process.exit(2);
}
