"""An MCP server (the official Python SDK, `MCPServer`, default settings) for the hostile-client
corpus: it tells from the server's side which tools actually ran.

usage: mcp_marker_server.py stdio | http PORT | sse PORT | modern PORT

Tools: `secret` (the one the tests deny) and `harmless`. Every run of a tool appends
`<tool name>\\n` to the file named by $TOOLWALL_MARKER (flushed and fsynced) before it answers.
Over HTTP it serves Streamable HTTP at http://127.0.0.1:PORT/mcp (every revision, 2026-07-28
included); `sse` serves the legacy HTTP+SSE transport (2024-11-05) at http://127.0.0.1:PORT/sse;
`modern` serves Streamable HTTP at 2026-07-28 only, as a modern-only server does by the spec:
a request without a modern MCP-Protocol-Version header (`initialize`, a session's GET) is
answered 400 with the UnsupportedProtocolVersion error naming the versions it speaks.
"""

import os
import sys

from mcp.server.mcpserver import MCPServer

server = MCPServer("toolwall-marker", log_level="ERROR")


def mark(name: str) -> None:
    fd = os.open(os.environ["TOOLWALL_MARKER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{name}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


@server.tool()
def secret() -> str:
    """The tool every test denies."""
    mark("secret")
    return "the secret ran"


@server.tool()
def harmless() -> str:
    """The control: a tool every test allows."""
    mark("harmless")
    return "harmless ran"


if __name__ == "__main__":
    if not os.environ.get("TOOLWALL_MARKER"):
        sys.exit("TOOLWALL_MARKER must name the marker file")
    if sys.argv[1:2] == ["stdio"]:
        server.run("stdio")
    elif sys.argv[1:2] == ["http"] and len(sys.argv) == 3:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    elif sys.argv[1:2] == ["modern"] and len(sys.argv) == 3:
        import json

        import uvicorn

        app = server.streamable_http_app()
        handshake = {b"2024-11-05", b"2025-03-26", b"2025-06-18", b"2025-11-25", b""}

        async def modern_only(scope, receive, send):
            if scope["type"] == "http":
                version = dict(scope["headers"]).get(b"mcp-protocol-version", b"")
                if version in handshake:
                    body = json.dumps({
                        "jsonrpc": "2.0",
                        "id": None,
                        "error": {
                            "code": -32022,
                            "message": "Unsupported protocol version",
                            "data": {"supported": ["2026-07-28"], "requested": version.decode() or None},
                        },
                    }).encode()
                    await send({"type": "http.response.start", "status": 400,
                                "headers": [(b"content-type", b"application/json")]})
                    await send({"type": "http.response.body", "body": body})
                    return
            await app(scope, receive, send)

        uvicorn.run(modern_only, host="127.0.0.1", port=int(sys.argv[2]), log_level="error")
    elif sys.argv[1:2] == ["sse"] and len(sys.argv) == 3:
        server.run("sse", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        sys.exit(__doc__)
