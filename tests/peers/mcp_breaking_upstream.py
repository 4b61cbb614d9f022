"""A Streamable HTTP MCP upstream whose call streams break: it lists `breaks-late` and
`breaks-early`; a `tools/call` of the first is answered with an SSE stream that carries one
progress notification and then loses its connection (no end chunk), of the second with the
head of an SSE stream and nothing else before the connection goes.

usage: PORT=... python mcp_breaking_upstream.py
"""

import json
import os
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOOLS = [
    {"name": "breaks-late", "description": "ok", "inputSchema": {"type": "object"}},
    {"name": "breaks-early", "description": "ok", "inputSchema": {"type": "object"}},
]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def reply(self, status, body=b""):
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Mcp-Session-Id", "s1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.reply(405)

    def do_DELETE(self):
        self.reply(200)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        try:
            msg = json.loads(body)
        except ValueError:
            msg = {}
        if not isinstance(msg, dict) or "id" not in msg or "method" not in msg:
            return self.reply(202)
        i, method = msg["id"], msg["method"]
        if method == "initialize":
            result = {"protocolVersion": msg["params"].get("protocolVersion", "2025-06-18"),
                      "capabilities": {"tools": {}}, "serverInfo": {"name": "breaking", "version": "1"}}
            return self.reply(200, json.dumps({"jsonrpc": "2.0", "id": i, "result": result}).encode())
        if method == "tools/list":
            return self.reply(200, json.dumps({"jsonrpc": "2.0", "id": i, "result": {"tools": TOOLS}}).encode())
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Mcp-Session-Id", "s1")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if msg.get("params", {}).get("name") == "breaks-late":
            progress = json.dumps({"jsonrpc": "2.0", "method": "notifications/progress",
                                   "params": {"progressToken": "p", "progress": 1}})
            event = f"event: message\ndata: {progress}\n\n".encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
        self.wfile.flush()
        self.connection.shutdown(socket.SHUT_RDWR)
        self.close_connection = True


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
