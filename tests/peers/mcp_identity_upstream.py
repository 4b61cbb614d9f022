"""A Streamable HTTP MCP server without sessions whose tool list depends on who asks, as many
hosted servers' do: it lists `echo` to everyone, `admin_reset` to `X-Api-Key: admin`, and
`sample_llm` to a 2026-07-28 request whose `_meta` envelope declares sampling. Like any server
that trusts its own listing, it runs whatever tool is called, and appends `NAME KEY` to the file
RAN for each run, so a test sees what a proxy in front let through.

- A file REVOKED present: every `tools/call` is refused with 401 and a Bearer challenge (a
  token revoked mid-session).
- `numbers` answers with numbers JSON readers write differently from how they read them
  (`987654321098765432101234`, `1.50`, `1E2`), written by hand, and an AWS key beside them.
- `vanish` runs (is noted in RAN), then the connection is closed without an answer: a server
  that crashed or was cut off after it took the call.
- `gateway` runs, then is answered 504 (a gateway in front that gave up waiting).
- A request with `X-Pages: SIZE`: its `tools/list` never ends, each page SIZE bytes long with a
  `nextCursor`, one second apart; each page served appends `PAGE` to RAN.

usage: RAN=path [REVOKED=path] python mcp_identity_upstream.py PORT
"""

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RAN = os.environ["RAN"]
REVOKED = os.environ.get("REVOKED", "")


def note(line):
    with open(RAN, "a") as f:
        f.write(line + "\n")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, message=None, headers=()):
        body = b"" if message is None else json.dumps(message).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.reply(405)

    def do_DELETE(self):
        self.reply(405)

    def do_POST(self):
        message = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        method, id_ = message.get("method"), message.get("id")
        params = message.get("params") or {}
        if id_ is None:
            return self.reply(202)
        if method == "initialize":
            return self.reply(200, {"jsonrpc": "2.0", "id": id_, "result": {
                "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "identity-upstream", "version": "1"}}})
        if method == "tools/list":
            size = self.headers.get("X-Pages")
            if size:
                time.sleep(1)
                note("PAGE")
                padding = "x" * int(size)
                return self.reply(200, {"jsonrpc": "2.0", "id": id_, "result": {
                    "tools": [{"name": "echo", "description": padding,
                               "inputSchema": {"type": "object"}}],
                    "nextCursor": "page-%d" % time.monotonic_ns()}})
            tools = [{"name": "echo", "inputSchema": {"type": "object"}},
                     {"name": "numbers", "inputSchema": {"type": "object"}},
                     {"name": "vanish", "inputSchema": {"type": "object"}},
                     {"name": "gateway", "inputSchema": {"type": "object"}}]
            if self.headers.get("X-Api-Key") == "admin":
                tools.append({"name": "admin_reset", "inputSchema": {"type": "object"}})
            meta = params.get("_meta") or {}
            if "sampling" in (meta.get("io.modelcontextprotocol/clientCapabilities") or {}):
                tools.append({"name": "sample_llm", "inputSchema": {"type": "object"}})
            return self.reply(200, {"jsonrpc": "2.0", "id": id_, "result": {"tools": tools}})
        if method == "tools/call":
            if REVOKED and os.path.exists(REVOKED):
                return self.reply(401, None, [(
                    "WWW-Authenticate", 'Bearer error="invalid_token", resource_metadata='
                    '"http://127.0.0.1:%d/.well-known/oauth-protected-resource"'
                    % self.server.server_address[1])])
            name = params.get("name")
            note("%s %s" % (name, self.headers.get("X-Api-Key")))
            if name == "vanish":
                self.close_connection = True
                return
            if name == "gateway":
                body = b"gateway timed out"
                self.send_response(504)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            if name == "numbers":
                body = ('{"jsonrpc":"2.0","id":%s,"result":{"content":[{"type":"text","text":"n"}],'
                        '"structuredContent":{"big":987654321098765432101234,"small":1.50,'
                        '"exp":1E2,"key":"AKIAQYLPMN5HHHFPZAM2"}}}' % json.dumps(id_)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            return self.reply(200, {"jsonrpc": "2.0", "id": id_, "result": {
                "content": [{"type": "text", "text": "ran " + str(name)}]}})
        return self.reply(200, {"jsonrpc": "2.0", "id": id_,
                                "error": {"code": -32601, "message": "Method not found"}})


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
