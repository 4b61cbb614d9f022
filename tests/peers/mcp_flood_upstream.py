"""A legacy HTTP+SSE MCP upstream that floods: it lists one tool, `flood`, and answers a call of
it with COUNT notifications of SIZE bytes each on the session's stream, then the result. The
stream is written as fast as the reader takes it (a blocking write per event), so what a proxy
in front holds of it is what the proxy chooses to hold.

usage: PORT=... [COUNT=100] [SIZE=1048576] python mcp_flood_upstream.py
"""

import json
import os
import queue
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COUNT = int(os.environ.get("COUNT", "100"))
SIZE = int(os.environ.get("SIZE", str(1 << 20)))
TOOLS = [{"name": "flood", "description": "floods the stream", "inputSchema": {"type": "object"}}]

sessions = {}
lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if not self.path.startswith("/sse"):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with lock:
            sid = str(len(sessions) + 1)
            outbox = sessions[sid] = queue.Queue()
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        try:
            self.wfile.write(f"event: endpoint\ndata: /messages?session={sid}\n\n".encode())
            self.wfile.flush()
            while True:
                message = outbox.get()
                self.wfile.write(b"event: message\ndata: " + message + b"\n\n")
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_POST(self):
        if not self.path.startswith("/messages?session="):
            # Not Streamable HTTP: a client that tries it first falls back to the stream.
            self.send_response(405)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        sid = self.path.split("session=")[-1]
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()
        outbox = sessions.get(sid)
        if outbox is None or "id" not in body:
            return
        method, rid = body.get("method"), body["id"]

        def answer(result):
            outbox.put(json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}).encode())

        if method == "initialize":
            answer({"protocolVersion": "2024-11-05", "capabilities": {"tools": {}},
                    "serverInfo": {"name": "flood", "version": "1"}})
        elif method == "tools/list":
            answer({"tools": TOOLS})
        elif method == "tools/call":
            filler = "x" * SIZE
            for i in range(COUNT):
                outbox.put(json.dumps({"jsonrpc": "2.0", "method": "notifications/message",
                                       "params": {"level": "info", "data": filler}}).encode())
            answer({"content": [{"type": "text", "text": "flooded"}]})
        else:
            outbox.put(json.dumps({"jsonrpc": "2.0", "id": rid,
                                   "error": {"code": -32601, "message": "no such method"}}).encode())


ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), Handler).serve_forever()
