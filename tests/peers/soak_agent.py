"""One client of toolwall's soak test: rounds of calls until a deadline, each outcome noted.

usage: soak_agent.py MODE NAME SECONDS TOOLWALL CONFIG SERVER_EVERYTHING NET_URL

MODE anthropic or openai: an agent. Each round N asks the model (that official SDK, pointed at
the proxy by the base URL `toolwall exec` sets; Anthropic streamed, OpenAI buffered) with the
user message "NAME-N", and runs the MCP tool calls the answer holds: `mcp__everything__*`
through `toolwall shim` (a shim per round, as an agent restarting its servers would),
`mcp__netev__*` over Streamable HTTP. MODE host: no model; each round calls netev's `echo`
with "NAME-N" through `toolwall mcp-proxy --stdio --config` (a client on the host).

Nothing is retried: a round that fails (the daemon killed under it) is noted as failed, so the
test knows which calls may be missing from the record. Prints one JSON report:
{"rounds": [{"n": N, "model": "ok"|ERROR, "tool_uses": [...], "calls": {name: "ok"|ERROR}}]}.
"""

import asyncio
import json
import os
import sys
import time

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

mode, name, seconds, toolwall, config, everything, net_url = sys.argv[1:8]
# A call the daemon's death cut must fail, not hang the soak.
TIMEOUT = 20.0


async def call(ctx, tool, arguments):
    try:
        async with ctx as streams:
            async with ClientSession(streams[0], streams[1], read_timeout_seconds=TIMEOUT) as session:
                await session.initialize()
                result = await session.call_tool(tool, arguments)
                if result.is_error:
                    return "tool error: " + " ".join(c.text for c in result.content if getattr(c, "text", None))
                return "ok"
    except BaseException as e:  # an ExceptionGroup from the transport's task group too
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        return failure(e)


def failure(e):
    """The innermost error of `e` (the one under a task group's ExceptionGroup), in one line."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return f"{type(e).__name__}: {e}"[:300]


def stdio(args):
    return stdio_client(StdioServerParameters(command=toolwall, args=args, env=dict(os.environ)))


def shim():
    return stdio(["shim", "--config", config, "--server-id", "everything", "--", everything, "stdio"])


def ask_anthropic(client, text):
    with client.messages.stream(
        model="claude-sonnet-4-5", max_tokens=200, messages=[{"role": "user", "content": text}]
    ) as stream:
        message = stream.get_final_message()
    return [(b.name, b.input) for b in message.content if b.type == "tool_use"]


def ask_openai(client, text):
    completion = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": text}]
    )
    calls = completion.choices[0].message.tool_calls or []
    return [(c.function.name, json.loads(c.function.arguments)) for c in calls]


async def agent_round(ask, client, n):
    text = f"{name}-{n}"
    try:
        proposed = ask(client, text)
    except Exception as e:
        return {"n": n, "model": failure(e), "tool_uses": [], "calls": {}}
    out = {"n": n, "model": "ok", "tool_uses": [p[0] for p in proposed], "calls": {}}
    for tool_use, arguments in proposed:
        _, server, tool = tool_use.split("__", 2)
        ctx = shim() if server == "everything" else streamable_http_client(net_url)
        out["calls"][tool_use] = await call(ctx, tool, arguments)
    return out


async def host_round(n):
    proxy = stdio(["mcp-proxy", "--stdio", "--config", config, "--upstream", net_url])
    outcome = await call(proxy, "echo", {"message": f"{name}-{n}"})
    return {"n": n, "model": "none", "tool_uses": [], "calls": {"echo": outcome}}


async def main():
    if mode == "anthropic":
        import anthropic

        client = anthropic.Anthropic(api_key="sk-test", max_retries=0, timeout=20)
        ask = ask_anthropic
    elif mode == "openai":
        import openai

        client = openai.OpenAI(api_key="sk-test", max_retries=0, timeout=20)
        ask = ask_openai
    deadline = time.monotonic() + float(seconds)
    rounds = []
    n = 0
    while time.monotonic() < deadline:
        n += 1
        if mode == "host":
            rounds.append(await host_round(n))
        else:
            rounds.append(await agent_round(ask, client, n))
        if any(v != "ok" for v in rounds[-1]["calls"].values()) or rounds[-1]["model"] not in ("ok", "none"):
            await asyncio.sleep(0.5)  # the daemon is restarting: don't spin
    print(json.dumps({"rounds": rounds}))


asyncio.run(main())
