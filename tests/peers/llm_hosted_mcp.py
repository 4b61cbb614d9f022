"""Hosted MCP tools (the provider runs them) driven through the official Python SDKs.

usage: llm_hosted_mcp.py PORT BASE_URL

Serves a fake provider on 127.0.0.1:PORT that records every request body it receives and
answers with a plain valid response (Anthropic Messages, OpenAI Responses; a streamed
Responses request whose input says "propose" gets an `mcp_approval_request` for `echo` of
server `s`). Then runs each scenario with the `openai` and `anthropic` SDKs pointed at BASE_URL
(toolwall's proxy, or the fake itself to show what the SDK sends without toolwall) and prints,
per scenario, what the SDK got (`ok`, the output item types, or the error) and the bodies the
fake received while it ran.
"""
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import openai

LOCK = threading.Lock()
BODIES = []

MESSAGE = {
    "id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
    "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
    "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1},
}


def response(output):
    return {
        "id": "resp_1", "object": "response", "created_at": 0, "status": "completed",
        "model": "m", "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
        "tools": [], "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                                "input_tokens_details": {"cached_tokens": 0},
                                "output_tokens_details": {"reasoning_tokens": 0}},
    }


TEXT = {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": "ok", "annotations": []}]}
PROPOSAL = {"type": "mcp_approval_request", "id": "mcpr_echo_proposed", "server_label": "s",
            "name": "echo", "arguments": "{\"message\":\"hi\"}"}


class Fake(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_):
        pass

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        try:
            body = json.loads(raw)
        except ValueError:
            body = {"unparsed": raw.decode("utf-8", "replace")}
        with LOCK:
            BODIES.append(body)
        if self.path.startswith("/v1/messages"):
            return self.send_json(MESSAGE)
        if body.get("stream"):
            return self.send_stream(body)
        return self.send_json(response([TEXT]))

    def send_json(self, value):
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def send_stream(self, body):
        item = PROPOSAL if "propose" in json.dumps(body.get("input")) else TEXT
        started = dict(response([]), status="in_progress")
        events = [
            {"type": "response.created", "sequence_number": 0, "response": started},
            {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": item},
            {"type": "response.output_item.done", "sequence_number": 2, "output_index": 0, "item": item},
            {"type": "response.completed", "sequence_number": 3, "response": response([item])},
        ]
        data = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events).encode()
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def mcp(allowed, **extra):
    entry = {"type": "mcp", "server_label": "s", "server_url": "https://mcp.example/mcp",
             "require_approval": "never"}
    if allowed is not None:
        entry["allowed_tools"] = allowed
    entry.update(extra)
    return entry


SERVER = {"type": "url", "url": "https://mcp.example/mcp", "name": "s"}


def scenarios(o, a):
    """name -> a function running it; returns what the SDK got."""
    def responses(**kw):
        r = o.responses.create(model="m", **kw)
        return [i.type for i in r.output]

    def streamed(**kw):
        types = []
        with o.responses.stream(model="m", **kw) as s:
            for _ in s:
                pass
            final = s.get_final_response()
        for i in final.output:
            types.append(i.type if i.type != "mcp_approval_request" else f"mcp_approval_request:{i.server_label}:{i.name}")
        return types

    def messages(betas, **kw):
        r = a.beta.messages.create(model="claude", max_tokens=10, betas=betas,
                                   messages=[{"role": "user", "content": "hi"}], **kw)
        return [b.type for b in r.content]

    approval_of = lambda tool, rid: [  # noqa: E731
        {"type": "mcp_approval_request", "id": rid, "server_label": "s", "name": tool,
         "arguments": "{\"message\":\"hi\"}"},
        {"type": "mcp_approval_response", "approval_request_id": rid, "approve": True},
    ]
    return {
        "openai_forced_echo": lambda: responses(
            input="hi", tools=[mcp(["echo", "add"])],
            tool_choice={"type": "mcp", "server_label": "s", "name": "echo"}),
        "openai_list": lambda: responses(input="hi", tools=[mcp(["echo", "add"])]),
        "openai_filter": lambda: responses(
            input="hi", tools=[mcp({"tool_names": ["echo", "add"], "read_only": False})]),
        "openai_unlisted": lambda: responses(input="hi", tools=[mcp(None)]),
        "openai_connector": lambda: responses(input="hi", tools=[
            {"type": "mcp", "server_label": "s", "connector_id": "connector_gmail",
             "authorization": "t", "allowed_tools": ["echo"]},
            {"type": "function", "name": "f", "parameters": {"type": "object"}}]),
        "openai_approve_echo": lambda: responses(
            input=approval_of("echo", "mcpr_echo_in_input"), tools=[mcp(["add"])]),
        "openai_approve_add": lambda: responses(
            input=approval_of("add", "mcpr_add_in_input"), tools=[mcp(["echo", "add"])]),
        "openai_proposes_echo": lambda: streamed(
            input="propose", tools=[mcp(["echo", "add"], require_approval="always")]),
        "openai_approve_proposed": lambda: responses(
            previous_response_id="resp_1", tools=[mcp(["add"])],
            input=[{"type": "mcp_approval_response", "approval_request_id": "mcpr_echo_proposed",
                    "approve": True}]),
        "anthropic_toolset": lambda: messages(
            ["mcp-client-2025-11-20"], mcp_servers=[SERVER],
            tools=[{"type": "mcp_toolset", "mcp_server_name": "s",
                    "default_config": {"enabled": False},
                    "configs": {"echo": {"enabled": True}, "add": {"enabled": True}}}]),
        "anthropic_toolset_default": lambda: messages(
            ["mcp-client-2025-11-20"], mcp_servers=[SERVER],
            tools=[{"type": "mcp_toolset", "mcp_server_name": "s"}]),
        "anthropic_tool_configuration": lambda: messages(
            ["mcp-client-2025-04-04"],
            mcp_servers=[dict(SERVER, tool_configuration={"enabled": True, "allowed_tools": ["echo", "add"]})]),
    }


def main():
    port, base = int(sys.argv[1]), sys.argv[2]
    server = ThreadingHTTPServer(("127.0.0.1", port), Fake)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    o = openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)
    a = anthropic.Anthropic(base_url=base, api_key="sk-test", max_retries=0)
    report = {}
    for name, run in scenarios(o, a).items():
        with LOCK:
            BODIES.clear()
        try:
            got = {"ok": run()}
        except (openai.APIStatusError, anthropic.APIStatusError) as e:
            got = {"status": e.status_code, "error": e.response.text}
        with LOCK:
            got["bodies"] = list(BODIES)
        report[name] = got
    server.shutdown()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
