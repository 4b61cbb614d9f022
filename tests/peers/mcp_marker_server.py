"""An MCP server (the official Python SDK, `MCPServer`, default settings) for the hostile-client
corpus: it tells from the server's side which tools actually ran.

usage: mcp_marker_server.py stdio | http PORT

Tools: `secret` (the one the tests deny) and `harmless`. Every run of a tool appends
`<tool name>\\n` to the file named by $TOOLWALL_MARKER (flushed and fsynced) before it answers.
Over HTTP it serves Streamable HTTP at http://127.0.0.1:PORT/mcp.
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
    else:
        sys.exit(__doc__)
