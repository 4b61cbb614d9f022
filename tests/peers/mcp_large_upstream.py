"""A Streamable HTTP MCP upstream with large messages, for the filter proxy's fairness test.

It lists 500 tools of 8 KB each (about 4 MB). A `tools/list` with a number id is answered as a
JSON body; one with the id `"sse"` as an SSE stream (a log notification, then the listing). Two
ids list small: `"late"` as an SSE stream of a 4 MB log notification and then a list that also
has `victim`, `"small"` as a JSON body without it. `get-sum` and `take-big` answer at once.
Each session gets its own `Mcp-Session-Id`. What it did is appended to the file `LOG` names,
a line each, as it happens: `listing sent` once a listing's last byte is written, `call NAME`
when a call comes in.

usage: PORT=... LOG=... python mcp_large_upstream.py
"""

import itertools
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOOLS = [{"name": "get-sum", "description": "adds", "inputSchema": {"type": "object"}},
         {"name": "take-big", "description": "takes a large argument", "inputSchema": {"type": "object"}}]
TOOLS += [{"name": f"tool-{i:04}", "description": "d" * 8000, "inputSchema": {"type": "object"}}
          for i in range(500)]
SMALL = TOOLS[:2]
NOTE = {"jsonrpc": "2.0", "method": "notifications/message",
        "params": {"level": "info", "data": "n" * (4 << 20)}}
SESSIONS = itertools.count(1)


def log(line):
    with open(os.environ["LOG"], "a") as f:
        f.write(line + "\n")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, body, content_type="application/json", status=200):
        session = self.headers.get("Mcp-Session-Id") or f"s{next(SESSIONS)}"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Mcp-Session-Id", session)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def do_GET(self):
        self.reply(b"", status=405)

    def do_DELETE(self):
        self.reply(b"")

    def do_POST(self):
        msg = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        if "id" not in msg:
            return self.reply(b"", status=202)
        i, method = msg["id"], msg["method"]
        if method == "initialize":
            result = {"protocolVersion": msg["params"].get("protocolVersion", "2025-06-18"),
                      "capabilities": {"tools": {}}, "serverInfo": {"name": "large", "version": "1"}}
            return self.reply(json.dumps({"jsonrpc": "2.0", "id": i, "result": result}).encode())
        if method == "tools/list":
            tools = SMALL + [{"name": "victim", "inputSchema": {"type": "object"}}] if i == "late" \
                else SMALL if i == "small" else TOOLS
            answer = json.dumps({"jsonrpc": "2.0", "id": i, "result": {"tools": tools}})
            if i == "late":
                stream = f"event: message\ndata: {json.dumps(NOTE)}\n\nevent: message\ndata: {answer}\n\n"
                self.reply(stream.encode(), "text/event-stream")
            elif i == "sse":
                note = json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                                   "params": {"level": "info", "data": "before the listing"}})
                stream = f"event: message\ndata: {note}\n\nevent: message\ndata: {answer}\n\n"
                self.reply(stream.encode(), "text/event-stream")
            else:
                self.reply(answer.encode())
            return log("listing sent")
        if method != "tools/call":
            return self.reply(json.dumps({"jsonrpc": "2.0", "id": i, "result": {}}).encode())
        name = msg["params"]["name"]
        log(f"call {name}")
        text = "sum=3" if name == "get-sum" else "taken"
        result = {"content": [{"type": "text", "text": text}]}
        self.reply(json.dumps({"jsonrpc": "2.0", "id": i, "result": result}).encode())


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
