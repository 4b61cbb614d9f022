"""Round-trip latency of `tools/call` over raw JSON-RPC, for comparing a direct connection
with one through toolwall (the shim or the filter proxy) in the same run.

usage: mcp_bench.py stdio N CMD ARGS...     (a stdio server, or `toolwall shim -- ...`)
       mcp_bench.py http N URL              (a Streamable HTTP endpoint)

Prints {"p50_us": ..., "p99_us": ..., "n": N}. Calls `get-sum`, which server-everything has.
"""

import http.client
import json
import subprocess
import sys
import time
import urllib.parse

INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def call(i):
    return {"jsonrpc": "2.0", "id": i, "method": "tools/call",
            "params": {"name": "get-sum", "arguments": {"a": i, "b": 1}}}


def stdio(n, argv):
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def send(m):
        p.stdin.write((json.dumps(m) + "\n").encode())
        p.stdin.flush()

    def until(i):
        while True:
            line = p.stdout.readline()
            if not line:
                raise SystemExit("server closed stdout")
            if json.loads(line).get("id") == i:
                return

    send(INIT); until(0); send(INITIALIZED)
    times = []
    for i in range(1, n + 1):
        t = time.perf_counter_ns(); send(call(i)); until(i); times.append(time.perf_counter_ns() - t)
    p.stdin.close(); p.wait(timeout=10)
    return times


def http_(n, url):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port)
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}

    def post(m):
        conn.request("POST", u.path, json.dumps(m), headers)
        r = conn.getresponse(); body = r.read()
        sid = r.getheader("mcp-session-id")
        if sid:
            headers["mcp-session-id"] = sid
        if r.status >= 300:
            raise SystemExit(f"HTTP {r.status}: {body[:200]!r}")
        return body

    post(INIT); headers["mcp-protocol-version"] = "2025-06-18"; post(INITIALIZED)
    times = []
    for i in range(1, n + 1):
        t = time.perf_counter_ns(); post(call(i)); times.append(time.perf_counter_ns() - t)
    return times


def main():
    kind, n = sys.argv[1], int(sys.argv[2])
    times = stdio(n, sys.argv[3:]) if kind == "stdio" else http_(n, sys.argv[3])
    times.sort()
    print(json.dumps({"n": n, "p50_us": times[len(times) // 2] / 1000, "p99_us": times[int(len(times) * 0.99)] / 1000}))


main()
