"""The official Python SDK's MCP client (mcp 2.3.0) pinned to one protocol revision, for the
revision tests (tests/tests/mcp_revisions.rs).

usage: mcp_revision_client.py stdio|http|sse TARGET VERSION [-- COMMAND ARGS...]

VERSION: 2026-07-28 (no handshake, no probe), auto (server/discover, then fallback), or a
handshake revision (2025-11-25, 2025-06-18, 2025-03-26, 2024-11-05) offered by `initialize`.
Lists the tools, calls `harmless` and `secret`, and prints one JSON report on stdout:
{"negotiated": ..., "tools": [...], "calls": {name: {"text": ...} | {"error": {"code", "message"}}}}.
"""

import json
import os
import sys

import anyio
import mcp.client.session as session_module
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPError


def client(kind: str, target: str, version: str, command: list[str]) -> Client:
    if version in ("2026-07-28", "auto"):
        mode = version
    else:
        # The SDK offers LATEST_HANDSHAKE_VERSION in `initialize`; the server echoes it when it
        # speaks it. `Client` takes only "legacy", "auto" or "2026-07-28" as its mode.
        session_module.LATEST_HANDSHAKE_VERSION = version
        mode = "legacy"
    if kind == "stdio":
        # The whole environment (the SDK passes a safe subset by default): the server
        # needs $TOOLWALL_MARKER.
        server = StdioServerParameters(command=command[0], args=command[1:], env=dict(os.environ))
    elif kind == "http":
        server = target
    elif kind == "sse":
        server = sse_client(target)
    else:
        sys.exit(__doc__)
    return Client(server, mode=mode, cache=None)


async def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    kind, target, version = sys.argv[1:4]
    command = sys.argv[sys.argv.index("--") + 1 :] if "--" in sys.argv else []
    report = {"calls": {}}
    with anyio.fail_after(60):
        async with client(kind, target, version, command) as c:
            report["negotiated"] = c.protocol_version
            tools = await c.list_tools()
            report["tools"] = sorted(t.name for t in tools.tools)
            for name in ("harmless", "secret"):
                try:
                    result = await c.call_tool(name, {})
                    text = result.content[0].text if result.content else None
                    report["calls"][name] = {"text": text, "isError": bool(result.is_error)}
                except MCPError as e:
                    report["calls"][name] = {
                        "error": {"code": e.error.code, "message": e.error.message}
                    }
    print(json.dumps(report))


anyio.run(main)
