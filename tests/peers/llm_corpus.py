"""Replays a corpus of hostile upstream responses through toolwall's LLM proxy to the official
Python SDKs, and reports which tool calls each SDK call assembled (or the error it raised).

Usage: llm_corpus.py UPSTREAM_PORT PROXY_URL CASE.json...

Every case is run twice: direct (the SDK against the fake upstream: proves the case is an
attack the SDK would act on) and through the proxy.

Each case (tests/corpus/llm/*.json):
  name      what it is
  sdk       anthropic.create | anthropic.stream | chat.create | chat.stream |
            responses.create | responses.stream
  status    upstream status (default 200)
  headers   upstream response headers (content-type, location, ...)
  body      the response body, verbatim
  then      optional {status, headers, body}: what a redirect's target path answers
  expect    optional list of call names that must arrive (allowed calls)

The fake upstream answers every request with the current case; a request to any path that
contains "-x" (a redirect's target) gets the case's "then".
"""

import http.server
import json
import sys
import threading

import anthropic
import openai

CURRENT = {}


class Upstream(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _answer(self):
        length = int(self.headers.get("content-length") or 0)
        if length:
            self.rfile.read(length)
        case = CURRENT["case"]
        if "-x" in self.path and "then" in case:
            case = case["then"]
        body = case["body"].encode()
        self.send_response(case.get("status", 200))
        for k, v in case.get("headers", {}).items():
            self.send_header(k, v)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = _answer
    do_GET = _answer


def calls_anthropic(message):
    return [b.name for b in message.content if b.type in ("tool_use", "server_tool_use", "mcp_tool_use")]


def calls_chat(completion):
    out = []
    for ch in completion.choices:
        m = ch.message
        for tc in m.tool_calls or []:
            if tc.type == "function":
                out.append(tc.function.name)
            elif tc.type == "custom":
                out.append(tc.custom.name)
        if getattr(m, "function_call", None):
            out.append(m.function_call.name)
    return out


def calls_responses(response):
    return [i.name for i in response.output if i.type in ("function_call", "custom_tool_call", "mcp_call")]


def run(case, base):
    a = anthropic.Anthropic(base_url=base, api_key="sk-test", max_retries=0)
    o = openai.OpenAI(base_url=base + "/v1", api_key="sk-test", max_retries=0)
    msgs = [{"role": "user", "content": "go"}]
    sdk = case["sdk"]
    if sdk == "anthropic.create":
        return calls_anthropic(a.messages.create(model="claude", max_tokens=10, messages=msgs))
    if sdk == "anthropic.stream":
        with a.messages.stream(model="claude", max_tokens=10, messages=msgs) as s:
            for _ in s:
                pass
            return calls_anthropic(s.get_final_message())
    if sdk == "chat.create":
        return calls_chat(o.chat.completions.create(model="gpt", messages=msgs))
    if sdk == "chat.stream":
        with o.chat.completions.stream(model="gpt", messages=msgs) as s:
            for _ in s:
                pass
            return calls_chat(s.get_final_completion())
    if sdk == "responses.create":
        return calls_responses(o.responses.create(model="gpt", input="go"))
    if sdk == "responses.stream":
        with o.responses.stream(model="gpt", input="go") as s:
            for _ in s:
                pass
            return calls_responses(s.get_final_response())
    raise ValueError(f"unknown sdk {sdk!r}")


def main():
    port, base, files = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    report = {}
    for path in files:
        with open(path) as f:
            case = json.load(f)
        CURRENT["case"] = case
        report[path] = {}
        for label, url in (("direct", f"http://127.0.0.1:{port}"), ("proxied", base)):
            try:
                report[path][label] = {"calls": run(case, url), "error": None}
            except Exception as e:  # an SDK error is a refusal, never a call
                report[path][label] = {"calls": [], "error": f"{type(e).__name__}: {e}"[:300]}
    print(json.dumps(report))


main()
