"""A real MCP client (the official Python SDK) for toolwall's end-to-end tests.

usage: mcp_client.py stdio|sse|http TARGET [CALL_JSON]

TARGET is a URL, or for stdio a JSON array [command, args...]. CALL_JSON is a JSON list of
[tool, arguments] pairs to call. Prints one JSON object: every listed tool (all pages), each
call's result or error, the first resource read and the first prompt fetched. With
MCP_CLIENT_PROGRESS=1 each call asks for progress; "progress" lists the notifications heard.
MCP_CLIENT_CAPABILITIES=sampling,elicitation,roots declares those client capabilities (servers
list some tools only to clients that have them); MCP_CLIENT_CALL_FIRST=1 makes the calls before
the session lists its tools.
"""

import asyncio
import json
import os
import sys

from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client


def dump(model):
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


def capabilities():
    """Callbacks for the capabilities MCP_CLIENT_CAPABILITIES names (the SDK declares a
    capability when its callback is given)."""
    wanted = set(filter(None, os.environ.get("MCP_CLIENT_CAPABILITIES", "").split(",")))
    callbacks = {}
    if "sampling" in wanted:
        async def sampling(context, params):
            from mcp.types import CreateMessageResult, TextContent
            return CreateMessageResult(role="assistant", content=TextContent(type="text", text="ok"), model="none")
        callbacks["sampling_callback"] = sampling
    if "elicitation" in wanted:
        async def elicitation(context, params):
            from mcp.types import ElicitResult
            return ElicitResult(action="decline")
        callbacks["elicitation_callback"] = elicitation
    if "roots" in wanted:
        async def roots(context):
            from mcp.types import ListRootsResult
            return ListRootsResult(roots=[])
        callbacks["list_roots_callback"] = roots
    return callbacks


async def list_all(session, out):
    cursor = None
    while True:
        params = {"cursor": cursor} if cursor else None
        page = await session.list_tools(params=params)
        out["tools"].extend(dump(t) for t in page.tools)
        cursor = page.next_cursor
        if not cursor:
            break


async def exercise(read, write, calls):
    out = {"tools": [], "calls": []}
    call_first = bool(os.environ.get("MCP_CLIENT_CALL_FIRST"))
    async with ClientSession(read, write, **capabilities()) as session:
        init = await session.initialize()
        if getattr(init, "instructions", None) is not None:
            out["instructions"] = init.instructions
        if not call_first:
            await list_all(session, out)
        for name, arguments in calls:
            # MCP_CLIENT_PROGRESS=1: ask for progress on each call and keep what was said.
            progress = None
            if os.environ.get("MCP_CLIENT_PROGRESS"):
                out.setdefault("progress", [])

                async def progress(done, total, message, name=name):
                    out["progress"].append({"name": name, "progress": done, "message": message})
            try:
                result = await session.call_tool(name, arguments, progress_callback=progress)
                out["calls"].append({"name": name, "result": dump(result)})
            except Exception as e:  # the SDK raises MCPError for JSON-RPC errors
                err = getattr(e, "error", None)
                out["calls"].append({
                    "name": name,
                    "error": {"code": getattr(err, "code", None), "message": getattr(err, "message", str(e))},
                })
        if call_first:
            await list_all(session, out)
        resources = await session.list_resources()
        if resources.resources:
            first = resources.resources[0]
            out["resource"] = dump(await session.read_resource(first.uri))
        prompts = await session.list_prompts()
        out["prompts"] = [p.name for p in prompts.prompts]
        out["prompt_descriptions"] = {p.name: p.description for p in prompts.prompts}
        simple = [p for p in prompts.prompts if not p.arguments]
        if simple:
            out["prompt"] = dump(await session.get_prompt(simple[0].name))
    return out


async def main():
    transport, target = sys.argv[1], sys.argv[2]
    calls = json.loads(sys.argv[3]) if len(sys.argv) > 3 else []
    if transport == "stdio":
        argv = json.loads(target)
        ctx = stdio_client(StdioServerParameters(command=argv[0], args=argv[1:]))
    elif transport == "sse":
        ctx = sse_client(target)
    else:
        ctx = streamable_http_client(target)
    async with ctx as streams:
        out = await exercise(streams[0], streams[1], calls)
    print(json.dumps(out, sort_keys=True))


asyncio.run(main())
