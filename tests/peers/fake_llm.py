"""A fake LLM API (stdlib only) for driving the real coding agents through toolwall.

usage: fake_llm.py --log REQUESTS.jsonl --port-file FILE

Speaks the Anthropic Messages API (`POST /v1/messages[?beta=true]`, streamed or not, plus
`count_tokens`, `HEAD /` and other probes) and the OpenAI Responses API (`POST /v1/responses`,
streamed; `GET /v1/responses`, Codex's WebSocket attempt, gets 426), Chat Completions
(`POST /v1/chat/completions`, streamed) and the Gemini API (`POST .../models/M:streamGenerateContent`,
`:generateContent`, `:countTokens`). Its model asks, in its
first turn, for two MCP tools of the server `everything`: `echo {"message": "hi"}` and
`get-sum {"a": 1, "b": 2}` (in each agent's own naming); once a tool result is in the
conversation it answers with text. Every request is logged as one JSON line.
"""
import argparse
import os
import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LOCK = threading.Lock()
LOG = None
# FAKE_LLM_ECHO: what the model asks `echo` to say (a test of what comes back puts a secret in it).
CALLS = [("echo", {"message": os.environ.get("FAKE_LLM_ECHO", "hi")}), ("get-sum", {"a": 1, "b": 2})]
# FAKE_LLM_CALLS: the calls its model asks for instead, as JSON [[tool, arguments], ...].
if os.environ.get("FAKE_LLM_CALLS"):
    CALLS = [tuple(c) for c in json.loads(os.environ["FAKE_LLM_CALLS"])]


def uid(prefix):
    return prefix + uuid.uuid4().hex[:24]


def has_tool_result(req):
    for m in req.get("messages") or []:
        for b in m.get("content") if isinstance(m.get("content"), list) else []:
            if isinstance(b, dict) and b.get("type") == "tool_result":
                return True
    for i in req.get("input") if isinstance(req.get("input"), list) else []:
        if isinstance(i, dict) and i.get("type") == "function_call_output":
            return True
    for m in req.get("messages") or []:
        if isinstance(m, dict) and m.get("role") == "tool":
            return True
    for c in req.get("contents") or []:
        for p in c.get("parts") or [] if isinstance(c, dict) else []:
            if isinstance(p, dict) and "functionResponse" in p:
                return True
    return False


# How each agent names tool `echo` of server `everything`: Claude Code and Qwen Code
# `mcp__everything__echo`, Codex a namespace, Gemini CLI `mcp_everything_echo`, OpenCode
# `everything_echo`.
FORMS = ("mcp__everything__", "mcp_everything_", "everything_")


def dispatcher(req):
    """Whether the agent offers its MCP tools only through a dispatcher (Qwen Code's default:
    `tool_call {"name", "arguments"}`, the tools named in a reminder in the conversation)."""
    tools = json.dumps(req.get("tools") or [])
    return '"tool_call"' in tools and "mcp__everything__echo" in json.dumps(req.get("messages") or [])


def wants_tools(req):
    """Only the agent's main turn offers MCP tools; side requests (titles, probes) get text."""
    return any(f + "echo" in json.dumps(req.get("tools") or []) for f in FORMS) or (
        "mcp__everything" in json.dumps(req.get("tools") or [])) or dispatcher(req)


def offered_form(req):
    """The prefix the agent gives the server's tools, as its request offers them."""
    tools = json.dumps(req.get("tools") or [])
    return next((f for f in FORMS if f + "echo" in tools), FORMS[0])


def anthropic_events(req):
    model = req.get("model", "claude-fake")
    ev = []

    def e(data):
        ev.append(f"event: {data['type']}\ndata: {json.dumps(data)}\n\n")

    e({"type": "message_start", "message": {
        "id": uid("msg_"), "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 1}}})
    if wants_tools(req) and not has_tool_result(req):
        for i, (tool, args) in enumerate(CALLS):
            e({"type": "content_block_start", "index": i, "content_block": {
                "type": "tool_use", "id": uid("toolu_"), "name": offered_form(req) + tool, "input": {}}})
            e({"type": "content_block_delta", "index": i,
               "delta": {"type": "input_json_delta", "partial_json": json.dumps(args)}})
            e({"type": "content_block_stop", "index": i})
        stop = "tool_use"
    else:
        e({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
        e({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "DONE"}})
        e({"type": "content_block_stop", "index": 0})
        stop = "end_turn"
    e({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
       "usage": {"output_tokens": 5}})
    e({"type": "message_stop"})
    return ev


def anthropic_message(req):
    """The buffered form: the same turn as one JSON message, assembled from the events."""
    content = []
    for ev in anthropic_events(req):
        data = json.loads(ev.split("data: ", 1)[1])
        if data["type"] == "content_block_start":
            content.append(data["content_block"])
        elif data["type"] == "content_block_delta":
            d = data["delta"]
            if d["type"] == "input_json_delta":
                content[-1]["input"] = json.loads(d["partial_json"])
            else:
                content[-1]["text"] += d["text"]
    stop = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    return {"id": uid("msg_"), "type": "message", "role": "assistant", "model": req.get("model"),
            "content": content, "stop_reason": stop, "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 5}}


def responses_events(req):
    base = {"id": uid("resp_"), "object": "response", "created_at": int(time.time()),
            "model": req.get("model", "gpt-fake"), "status": "in_progress", "output": []}
    ev = []

    def e(data):
        ev.append(f"event: {data['type']}\ndata: {json.dumps(data)}\n\n")

    e({"type": "response.created", "response": base})
    items = []
    if wants_tools(req) and not has_tool_result(req):
        for tool, args in CALLS:
            # Codex offers MCP tools in a namespace, with `-` written `_`.
            items.append({"type": "function_call", "id": uid("fc_"), "status": "completed",
                          "call_id": uid("call_"), "namespace": "mcp__everything",
                          "name": tool.replace("-", "_"), "arguments": json.dumps(args)})
    else:
        items.append({"type": "message", "id": uid("msg_"), "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": "DONE", "annotations": []}]})
    for i, item in enumerate(items):
        added = dict(item, status="in_progress")
        if item["type"] == "function_call":
            added["arguments"] = ""
        else:
            added["content"] = []
        e({"type": "response.output_item.added", "output_index": i, "item": added})
        if item["type"] == "function_call":
            e({"type": "response.function_call_arguments.delta", "output_index": i,
               "item_id": item["id"], "delta": item["arguments"]})
            e({"type": "response.function_call_arguments.done", "output_index": i,
               "item_id": item["id"], "arguments": item["arguments"]})
        e({"type": "response.output_item.done", "output_index": i, "item": item})
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
             "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 15}
    e({"type": "response.completed", "response": dict(base, status="completed", output=items, usage=usage)})
    return ev


def chat_events(req):
    """Chat Completions, streamed: the calls in the agent's own form, then text."""
    base = {"id": uid("chatcmpl-"), "object": "chat.completion.chunk", "created": int(time.time()),
            "model": req.get("model", "gpt-fake")}
    ev = []

    def e(choice):
        ev.append(f"data: {json.dumps(dict(base, choices=[choice]))}\n\n")

    if wants_tools(req) and not has_tool_result(req):
        form = offered_form(req)
        for i, (tool, args) in enumerate(CALLS):
            name, arguments = form + tool, args
            if dispatcher(req):
                name, arguments = "tool_call", {"name": "mcp__everything__" + tool, "arguments": args}
            e({"index": 0, "delta": {"role": "assistant", "tool_calls": [{
                "index": i, "id": uid("call_"), "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)}}]}, "finish_reason": None})
        e({"index": 0, "delta": {}, "finish_reason": "tool_calls"})
    else:
        e({"index": 0, "delta": {"role": "assistant", "content": "DONE"}, "finish_reason": None})
        e({"index": 0, "delta": {}, "finish_reason": "stop"})
    ev.append("data: [DONE]\n\n")
    return ev


def gemini_response(req):
    """One Gemini response: the calls in Gemini CLI's form, then text."""
    if wants_tools(req) and not has_tool_result(req):
        form = offered_form(req)
        parts = [{"functionCall": {"name": form + tool, "args": args}} for tool, args in CALLS]
    else:
        parts = [{"text": "DONE"}]
    return {"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP",
                            "index": 0}],
            "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15},
            "modelVersion": req.get("model", "gemini-fake")}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def _body(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        entry = {"method": self.command, "path": self.path, "headers": dict(self.headers.items())}
        try:
            entry["json"] = json.loads(body) if body else None
        except ValueError:
            entry["raw"] = body[:2000].decode("utf-8", "replace")
        with LOCK, open(LOG, "a") as f:
            f.write(json.dumps(entry) + "\n")
        return entry.get("json") or {}

    def _json(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _sse(self, events):
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for ev in events:
            self.wfile.write(ev.encode())
            self.wfile.flush()
        self.close_connection = True

    def do_HEAD(self):
        self._body()
        self._json(200, {})

    def do_GET(self):
        self._body()
        path = self.path.split("?")[0]
        if path.endswith("/responses"):
            return self._json(426, {"error": {"message": "websocket not supported"}})
        if path.endswith("/models"):
            return self._json(200, {"object": "list", "data": [], "models": []})
        self._json(200, {})

    def do_POST(self):
        req = self._body()
        path = self.path.split("?")[0]
        if path.endswith("/messages/count_tokens"):
            return self._json(200, {"input_tokens": 10})
        if path.endswith("/messages"):
            if req.get("stream"):
                return self._sse(anthropic_events(req))
            return self._json(200, anthropic_message(req))
        if path.endswith("/responses"):
            return self._sse(responses_events(req))
        if path.endswith("/chat/completions"):
            return self._sse(chat_events(req))
        if path.endswith(":streamGenerateContent"):
            return self._sse([f"data: {json.dumps(gemini_response(req))}\r\n\r\n"])
        if path.endswith(":generateContent"):
            return self._json(200, gemini_response(req))
        if path.endswith(":countTokens"):
            return self._json(200, {"totalTokens": 10})
        self._json(200, {})


def main():
    global LOG
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    ap.add_argument("--port-file", required=True)
    args = ap.parse_args()
    LOG = args.log
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    with open(args.port_file + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))

    os.rename(args.port_file + ".tmp", args.port_file)
    sys.stdout.flush()
    server.serve_forever()


if __name__ == "__main__":
    main()
