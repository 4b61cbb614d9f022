"""Round-trip latency of `tools/call` over raw JSON-RPC, for comparing a direct connection
with one through toolwall (the shim or the filter proxy) in the same run.

usage: mcp_bench.py stdio N CMD ARGS...     (a stdio server, or `toolwall shim -- ...`)
       mcp_bench.py http N URL              (a Streamable HTTP endpoint)
       mcp_bench.py pair N SPEC_A SPEC_B    (two sessions, calls interleaved; a SPEC is JSON:
                                             ["stdio", CMD, ARGS...] or ["http", URL])
       mcp_bench.py multi N SPEC...         (any number of sessions, interleaved call by call,
                                             the order rotated each turn; a SPEC may also be
                                             {"spec": SPEC, "pid": PID}: that process's CPU is
                                             measured over the timed calls)

Prints {"p50_us": ..., "p99_us": ..., "n": N} (pair: one such object per session, "a" and "b";
multi: a list "sessions", with "cpu_us_per_call" where a pid was given). Calls `get-sum`, which
server-everything has.
"""

import http.client
import json
import os
import subprocess
import sys
import time
import urllib.parse

INIT = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}
# Calls of each session before `pair` measures (node's JIT warms up on the first ones).
WARM = 200


def call(i):
    return {"jsonrpc": "2.0", "id": i, "method": "tools/call",
            "params": {"name": "get-sum", "arguments": {"a": i, "b": 1}}}


def stdio_session(argv):
    """A stdio session: returns (one call, close)."""
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

    def one(i):
        send(call(i)); until(i)

    def close():
        p.stdin.close(); p.wait(timeout=10)

    return one, close


def http_session(url):
    """A Streamable HTTP session on one keep-alive connection: returns (one call, close)."""
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
    return (lambda i: post(call(i))), conn.close


def session(spec):
    return stdio_session(spec[1:]) if spec[0] == "stdio" else http_session(spec[1])


def timed(one, i):
    t = time.perf_counter_ns(); one(i); return time.perf_counter_ns() - t


def p(times, q):
    times = sorted(times)
    return times[min(len(times) - 1, int(len(times) * q))] / 1000


def cpu_ns(pid):
    """CPU time (user and system, ns) of every live thread of `pid`, from the scheduler's
    own accounting (`/proc/PID/task/*/schedstat`): `/proc/PID/stat` counts in clock ticks of
    10 ms, coarser than a round's whole share."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return total


def multi(n, specs):
    specs = [s if isinstance(s, dict) else {"spec": s} for s in specs]
    sessions = [session(s["spec"]) for s in specs]
    k = len(sessions)
    for i in range(1, WARM + 1):
        for one, _ in sessions:
            one(i)
    times = [[] for _ in sessions]
    pids = [s.get("pid") for s in specs]
    before = [cpu_ns(p) if p else 0 for p in pids]
    for i in range(WARM + 1, WARM + n + 1):
        # Each session goes first as often as the others, so none is always the one that
        # meets a cold cache or a just-woken server.
        for j in range(k):
            s = (i + j) % k
            times[s].append(timed(sessions[s][0], i))
    after = [cpu_ns(p) if p else 0 for p in pids]
    for _, close in sessions:
        close()
    out = []
    for s in range(k):
        o = {"p50_us": p(times[s], 0.5), "p99_us": p(times[s], 0.99)}
        if pids[s]:
            o["cpu_us_per_call"] = (after[s] - before[s]) / 1000 / n
        out.append(o)
    print(json.dumps({"n": n, "sessions": out}))


def main():
    kind, n = sys.argv[1], int(sys.argv[2])
    if kind == "multi":
        multi(n, [json.loads(a) for a in sys.argv[3:]])
        return
    if kind == "pair":
        # Two sessions, their calls interleaved one by one: both see the same moments of the
        # machine, so what it does meanwhile (other VMs, the server's JIT) falls on both.
        (a, close_a), (b, close_b) = session(json.loads(sys.argv[3])), session(json.loads(sys.argv[4]))
        for i in range(1, WARM + 1):
            a(i); b(i)
        ta, tb = [], []
        for i in range(WARM + 1, WARM + n + 1):
            if i % 2:
                ta.append(timed(a, i)); tb.append(timed(b, i))
            else:
                tb.append(timed(b, i)); ta.append(timed(a, i))
        close_a(); close_b()
        print(json.dumps({"n": n, "a": {"p50_us": p(ta, 0.5), "p99_us": p(ta, 0.99)},
                          "b": {"p50_us": p(tb, 0.5), "p99_us": p(tb, 0.99)}}))
        return
    one, close = stdio_session(sys.argv[3:]) if kind == "stdio" else http_session(sys.argv[3])
    times = [timed(one, i) for i in range(1, n + 1)]
    close()
    print(json.dumps({"n": n, "p50_us": p(times, 0.5), "p99_us": p(times, 0.99)}))


main()
