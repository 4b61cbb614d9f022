"""Streamable HTTP resumption over raw HTTP: does `Last-Event-ID` on a GET replay what the
server sent after that event? Used to check that the filter proxy passes event ids and the
header through.

usage: mcp_resume.py URL       prints {"ids": bool, "replayed": bool}
"""

import http.client
import json
import socket
import sys
import urllib.parse

url = urllib.parse.urlparse(sys.argv[1])
headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


def connect():
    return http.client.HTTPConnection(url.hostname, url.port, timeout=10)


def events(body):
    """(id, data) of each SSE event in a complete body."""
    out, eid, data = [], None, []
    for line in body.decode().splitlines():
        if line.startswith("id:"):
            eid = line[3:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "":
            if data:
                out.append((eid, "\n".join(data)))
            eid, data = None, []
    if data:
        out.append((eid, "\n".join(data)))
    return out


def post(message):
    conn = connect()
    conn.request("POST", url.path, json.dumps(message), headers)
    r = conn.getresponse()
    body = r.read()
    if r.getheader("mcp-session-id"):
        headers["mcp-session-id"] = r.getheader("mcp-session-id")
    return events(body) if "event-stream" in (r.getheader("content-type") or "") else []


init = post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "resume", "version": "1"}}})
headers["mcp-protocol-version"] = "2025-06-18"
post({"jsonrpc": "2.0", "method": "notifications/initialized"})
call = post({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
             "params": {"name": "get-sum", "arguments": {"a": 20, "b": 22}}})
ids = bool(init) and all(e[0] for e in init + call)

replayed = False
if ids:
    conn = connect()
    conn.request("GET", url.path, headers={**headers, "Accept": "text/event-stream", "Last-Event-ID": init[-1][0]})
    r = conn.getresponse()
    r.fp.raw._sock.settimeout(3) if hasattr(r.fp, "raw") else None
    try:
        while True:
            line = r.fp.readline()
            if not line:
                break
            if b"The sum of 20 and 22 is 42" in line:
                replayed = True
                break
    except (socket.timeout, TimeoutError, OSError):
        pass
print(json.dumps({"ids": ids, "replayed": replayed}))
