"""A scripted AI agent for toolwall's three-layer end-to-end test.

usage: scripted_agent.py TOOLWALL CONFIG SERVER_EVERYTHING NET_URL

Like a real agent it asks the model (the official `anthropic` SDK, streaming, pointed at the
proxy by ANTHROPIC_BASE_URL, which `toolwall exec` sets) and runs the MCP tool calls it gets
back: `mcp__everything__*` on a stdio server behind `toolwall shim`, `mcp__netev__*` on a
network server over Streamable HTTP. Then, like code that calls a tool the model never asked
for, it calls `get-sum` through the shim directly. Prints one JSON report.
"""

import asyncio
import json
import os
import sys

import anthropic
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

toolwall, config, everything, net_url = sys.argv[1:5]


async def call(ctx, name, arguments):
    async with ctx as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            try:
                result = await session.call_tool(name, arguments)
                return {"ok": [c.text for c in result.content if getattr(c, "text", None)]}
            except Exception as e:
                err = getattr(e, "error", None)
                return {"error": getattr(err, "message", str(e))}


def shim():
    args = ["shim", "--config", config, "--server-id", "everything", "--", everything, "stdio"]
    return stdio_client(StdioServerParameters(command=toolwall, args=args, env=dict(os.environ)))


async def main():
    client = anthropic.Anthropic(api_key="sk-test", max_retries=0)
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=200, messages=[{"role": "user", "content": "go"}]
    ) as stream:
        message = stream.get_final_message()
    report = {
        "stop_reason": message.stop_reason,
        "tool_uses": [b.name for b in message.content if b.type == "tool_use"],
        "texts": [b.text for b in message.content if b.type == "text"],
        "results": {},
    }
    for block in message.content:
        if block.type != "tool_use":
            continue
        prefix, server, tool = block.name.split("__", 2)
        if server == "everything":
            report["results"][block.name] = await call(shim(), tool, block.input)
        else:
            report["results"][block.name] = await call(streamable_http_client(net_url), tool, block.input)
    report["direct_get_sum"] = await call(shim(), "get-sum", {"a": 1, "b": 2})
    print(json.dumps(report))


asyncio.run(main())
