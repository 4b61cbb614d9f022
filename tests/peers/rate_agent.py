"""An agent whose calls test that a session's rate limit is counted once, in the daemon.

usage: rate_agent.py TOOLWALL CONFIG SERVER_EVERYTHING EXTRA

It asks the model (the official `anthropic` SDK, streaming, through the proxy that `toolwall
exec` points ANTHROPIC_BASE_URL at) and runs every `mcp__everything__*` call it gets back, each
through a shim process of its own, as agents that start a server per task do; then it makes
EXTRA more `echo` calls the model never asked for. Prints one JSON report.
"""

import asyncio
import json
import os
import sys

import anthropic
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

toolwall, config, everything, extra = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])


async def call(name, arguments):
    args = ["shim", "--config", config, "--server-id", "everything", "--", everything, "stdio"]
    params = StdioServerParameters(command=toolwall, args=args, env=dict(os.environ))
    async with stdio_client(params) as streams:
        async with ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            try:
                result = await session.call_tool(name, arguments)
            except Exception as e:
                err = getattr(e, "error", None)
                return {"error": getattr(err, "message", str(e))}
            text = " ".join(c.text for c in result.content if getattr(c, "text", None))
            return {"error": text} if result.is_error else {"ok": text}


async def main():
    client = anthropic.Anthropic(api_key="sk-test", max_retries=0)
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=200, messages=[{"role": "user", "content": "go"}]
    ) as stream:
        message = stream.get_final_message()
    report = {"tool_uses": [], "results": []}
    for block in message.content:
        if block.type == "tool_use":
            report["tool_uses"].append(block.name)
            tool = block.name.split("__", 2)[2]
            report["results"].append(await call(tool, block.input))
    for i in range(extra):
        report["results"].append(await call("echo", {"message": f"extra {i}"}))
    print(json.dumps(report))


asyncio.run(main())
