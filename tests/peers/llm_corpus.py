"""Replays a corpus of hostile upstream responses through toolwall's LLM proxy to the official
Python SDKs, and reports which tool calls each SDK call assembled (or the error it raised).

Usage: llm_corpus.py UPSTREAM_PORT PROXY_URL CASE.json...

Every case is run twice: direct (the SDK against the fake upstream: proves the case is an
attack the SDK would act on) and through the proxy.

Each case (tests/corpus/llm/*.json):
  name      what it is
  sdk       what the SDK is asked, and where the calls are read from:
              anthropic.create | anthropic.stream          messages.create / messages.stream
              chat.create | chat.stream                    chat.completions
              responses.create | responses.stream          responses
              anthropic.sessions.events.stream             beta.sessions.events.stream (Managed
                                                           Agents SSE): agent.custom_tool_use,
                                                           agent.mcp_tool_use, agent.tool_use
              anthropic.sessions.events.list               beta.sessions.events.list: the same
              anthropic.batches.results                    messages.batches.results: the tool
                                                           calls of each succeeded result
              chatkit.threads.list_items                   beta.chatkit.threads.list_items:
                                                           chatkit.client_tool_call items
              assistants.runs.retrieve                     beta.threads.runs.retrieve: the run's
                                                           required_action tool calls
              gemini.create | gemini.stream                google-genai models.generate_content /
                                                           generate_content_stream: every
                                                           function_call part of every candidate
                                                           (of every chunk)
  status    upstream status (default 200)
  headers   upstream response headers (content-type, location, ...)
  body      the response body, verbatim
  chunks    instead of body: [[delay_ms, text], ...], each text sent (chunked transfer
            coding) after its delay, so a proxy sees the parts apart in time
  then      optional {status, headers, body, chunks}: what a redirect's target path answers
  routes    optional {path: {status, headers, body, chunks}}: what a request for exactly that
            path (query left off) answers instead of the case itself
  expect    optional list of call names that must arrive (allowed calls)
  attacks   optional list of peers ("Python", "TypeScript") the case is an attack on (the
            harness's check; all if absent)
  refused   optional HTTP status the proxy must refuse the SDK's request with (the harness's
            check, on the report's "status": that of the error the SDK raised, if an HTTP one)

The fake upstream answers every request with the current case; a request to any path that
contains "-x" (a redirect's target) gets the case's "then", one named in "routes" its answer.
"{upstream}" in a body or chunk is replaced by the fake upstream's own URL
(http://127.0.0.1:UPSTREAM_PORT), for a body that names the provider's host (a batch's
results_url, say).
"""

import http.server
import json
import sys
import threading
import time
from urllib.parse import urlsplit

import anthropic
import openai
from google import genai
from google.genai import types as genai_types

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
        path = urlsplit(self.path).path
        if path in case.get("routes", {}):
            case = case["routes"][path]
        elif "-x" in self.path and "then" in case:
            case = case["then"]
        fill = lambda text: text.replace("{upstream}", CURRENT["upstream"]).encode()
        self.send_response(case.get("status", 200))
        for k, v in case.get("headers", {}).items():
            self.send_header(k, v)
        if "chunks" in case:
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for delay_ms, text in case["chunks"]:
                time.sleep(delay_ms / 1000)
                data = fill(text)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        body = fill(case["body"])
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


def calls_session_events(events):
    return [e.name for e in events if e.type in ("agent.custom_tool_use", "agent.mcp_tool_use", "agent.tool_use")]


def calls_batch_results(results):
    out = []
    for r in results:
        if r.result.type == "succeeded":
            out += calls_anthropic(r.result.message)
    return out


def calls_chatkit_items(items):
    return [i.name for i in items if i.type == "chatkit.client_tool_call"]


def calls_run(run):
    action = run.required_action
    if action is None:
        return []
    return [tc.function.name for tc in action.submit_tool_outputs.tool_calls]


def calls_gemini(response):
    out = []
    for c in response.candidates or []:
        for p in (c.content.parts if c.content else None) or []:
            if p.function_call is not None:
                out.append(p.function_call.name)
    return out


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
    if sdk == "anthropic.sessions.events.stream":
        with a.beta.sessions.events.stream("sesn_1") as s:
            return calls_session_events(s)
    if sdk == "anthropic.sessions.events.list":
        return calls_session_events(a.beta.sessions.events.list("sesn_1"))
    if sdk == "anthropic.batches.results":
        return calls_batch_results(a.messages.batches.results("msgbatch_1"))
    if sdk == "chatkit.threads.list_items":
        return calls_chatkit_items(o.beta.chatkit.threads.list_items("cthr_1"))
    if sdk == "assistants.runs.retrieve":
        return calls_run(o.beta.threads.runs.retrieve("run_1", thread_id="thread_1"))
    if sdk.startswith("gemini."):
        g = genai.Client(
            api_key="AIza-test",
            http_options=genai_types.HttpOptions(base_url=base, retry_options=genai_types.HttpRetryOptions(attempts=1)),
        )
        if sdk == "gemini.create":
            return calls_gemini(g.models.generate_content(model="gemini-2.5-flash", contents="go"))
        if sdk == "gemini.stream":
            out = []
            for chunk in g.models.generate_content_stream(model="gemini-2.5-flash", contents="go"):
                out += calls_gemini(chunk)
            return out
    raise ValueError(f"unknown sdk {sdk!r}")


def main():
    port, base, files = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Upstream)
    CURRENT["upstream"] = f"http://127.0.0.1:{port}"
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
                report[path][label] = {
                    "calls": [],
                    "error": f"{type(e).__name__}: {e}"[:300],
                    "status": getattr(e, "status_code", None) or getattr(e, "code", None),
                }
    print(json.dumps(report))


main()
