"""An OpenTelemetry collector stand-in: receives OTLP logs and traces, decodes them with the
official `opentelemetry-proto` package, and writes what arrived as JSON lines, so the
end-to-end tests (tests/tests/otlp.rs) can check what toolwall exports.

usage: otlp_collector.py --protocol grpc|http --port PORT --out FILE
                         [--header NAME=VALUE ...] [--refuse N] [--tls CERT KEY]

  --protocol  http: OTLP/HTTP with protobuf bodies, `POST /v1/logs` and `POST /v1/traces`
                    (`Content-Type: application/x-protobuf`, optionally `Content-Encoding:
                    gzip`); answers 200 with an empty serialized Export*ServiceResponse.
                    Another path or method gets 404, another content type or encoding 415,
                    a body that does not decode 400.
              grpc: OTLP/gRPC, `LogsService/Export` and `TraceService/Export` (grpcio; gzip
                    message compression is handled by grpcio).
  --port      binds 127.0.0.1:PORT; 0 picks a free port. Once ready it prints one line
              `listening PORT` (the real port) to stdout.
  --out       JSON lines are appended here (the file is created at start).
  --header    NAME=VALUE, repeatable: an export request without that header (HTTP header or
              gRPC metadata; the name is case-insensitive, the value must match exactly) is
              refused, HTTP 401 / gRPC UNAUTHENTICATED, and recorded as
              {"refused": "missing header NAME"}.
  --tls       CERT KEY (PEM files): serve HTTPS / gRPC over TLS with that certificate.
  --max-bytes N: refuse requests larger than N bytes, HTTP 413 / gRPC RESOURCE_EXHAUSTED (as
              real collectors do: the OpenTelemetry Collector's gRPC default is 4 MiB); HTTP
              refusals are recorded as {"refused": "too large: N bytes"}.
  --refuse    N: the first N export requests that pass the header check are refused, HTTP
              503 / gRPC UNAVAILABLE (a collector in trouble), each recorded as
              {"refused": "forced"}.

One line per decoded item:
  {"signal": "log", "resource": {attrs}, "scope": NAME, "time_unix_nano": N,
   "observed_time_unix_nano": N, "severity_text": S, "severity_number": N, "body": VALUE,
   "attributes": {attrs}, "trace_id": HEX, "span_id": HEX, "event_name": S}
  {"signal": "span", "resource": {attrs}, "scope": NAME, "name": S, "trace_id": HEX,
   "span_id": HEX, "parent_span_id": HEX, "kind": N, "start_time_unix_nano": N,
   "end_time_unix_nano": N, "attributes": {attrs}, "status": {"code": N, "message": S},
   "events": [{"name": S, "time_unix_nano": N, "attributes": {attrs}}]}
AnyValues become plain JSON: string, int, double (NaN and the infinities as the strings
"NaN", "Infinity", "-Infinity"), bool, array -> list, kvlist -> object, bytes -> hex, unset
-> null. IDs are lowercase hex ("" when empty). All lines of one request are written with a
single write and fsynced before the response, so a reader that sees a line of a request sees
all of them, and sees them before the exporter gets its answer.

Stops cleanly (exit 0) on SIGTERM or SIGINT. Needs only opentelemetry-proto, grpcio and
protobuf (pinned in xtask/peers/requirements.txt).
"""

import argparse
import gzip
import json
import math
import os
import signal
import ssl
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2, logs_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


def log(msg):
    print(f"otlp_collector: {msg}", file=sys.stderr, flush=True)


# ---- OTLP -> plain JSON -------------------------------------------------------------------


def plain(any_value):
    """An AnyValue as a plain JSON value."""
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "string_value":
        return any_value.string_value
    if kind == "bool_value":
        return any_value.bool_value
    if kind == "int_value":
        return any_value.int_value
    if kind == "double_value":
        d = any_value.double_value
        if math.isnan(d):
            return "NaN"
        if math.isinf(d):
            return "Infinity" if d > 0 else "-Infinity"
        return d
    if kind == "array_value":
        return [plain(v) for v in any_value.array_value.values]
    if kind == "kvlist_value":
        return attrs(any_value.kvlist_value.values)
    if kind == "bytes_value":
        return any_value.bytes_value.hex()
    # string_value_strindex (profiles' string table) or a newer kind: say what it was.
    return {kind: getattr(any_value, kind)}


def attrs(key_values):
    """Repeated KeyValue as an object (a repeated key: the last one wins)."""
    return {kv.key: plain(kv.value) for kv in key_values}


def log_lines(request):
    lines = []
    for rl in request.resource_logs:
        resource = attrs(rl.resource.attributes)
        for sl in rl.scope_logs:
            for r in sl.log_records:
                lines.append({
                    "signal": "log",
                    "resource": resource,
                    "scope": sl.scope.name,
                    "time_unix_nano": r.time_unix_nano,
                    "observed_time_unix_nano": r.observed_time_unix_nano,
                    "severity_text": r.severity_text,
                    "severity_number": r.severity_number,
                    "body": plain(r.body),
                    "attributes": attrs(r.attributes),
                    "trace_id": r.trace_id.hex(),
                    "span_id": r.span_id.hex(),
                    "event_name": r.event_name,
                })
    return lines


def span_lines(request):
    lines = []
    for rs in request.resource_spans:
        resource = attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                lines.append({
                    "signal": "span",
                    "resource": resource,
                    "scope": ss.scope.name,
                    "name": s.name,
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex(),
                    "kind": s.kind,
                    "start_time_unix_nano": s.start_time_unix_nano,
                    "end_time_unix_nano": s.end_time_unix_nano,
                    "attributes": attrs(s.attributes),
                    "status": {"code": s.status.code, "message": s.status.message},
                    "events": [
                        {"name": e.name, "time_unix_nano": e.time_unix_nano,
                         "attributes": attrs(e.attributes)}
                        for e in s.events
                    ],
                })
    return lines


# The two signals: request type, response type, JSON lines of a decoded request.
SIGNALS = {
    "logs": (logs_service_pb2.ExportLogsServiceRequest,
             logs_service_pb2.ExportLogsServiceResponse, log_lines),
    "traces": (trace_service_pb2.ExportTraceServiceRequest,
               trace_service_pb2.ExportTraceServiceResponse, span_lines),
}


# ---- what every request goes through --------------------------------------------------------


class Collector:
    def __init__(self, out, headers, refuse):
        self.fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.headers = headers  # [(lowercase name, name as given, value)]
        self.refuse_left = refuse
        self.lock = threading.Lock()

    def write(self, lines):
        data = "".join(json.dumps(line) + "\n" for line in lines).encode()
        with self.lock:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view):]
            os.fsync(self.fd)

    def check(self, get_all):
        """None if the request may go on, else "unauthenticated" or "unavailable" (recorded).
        get_all(lowercase name) -> the request's values of that header."""
        for lower, name, value in self.headers:
            if value not in get_all(lower):
                self.write([{"refused": f"missing header {name}"}])
                return "unauthenticated"
        with self.lock:
            forced = self.refuse_left > 0
            if forced:
                self.refuse_left -= 1
        if forced:
            self.write([{"refused": "forced"}])
            return "unavailable"
        return None


def rpc_status(code, message):
    """A serialized google.rpc.Status {code = 1; message = 2}, the OTLP/HTTP error body."""
    def varint(n):
        out = bytearray()
        while True:
            b, n = n & 0x7F, n >> 7
            out.append(b | (0x80 if n else 0))
            if not n:
                return bytes(out)
    msg = message.encode()
    return b"\x08" + varint(code) + b"\x12" + varint(len(msg)) + msg


# ---- OTLP/HTTP ---------------------------------------------------------------------------


class HttpHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "otlp-collector"
    collector = None  # set in main

    def log_message(self, *args):
        pass

    def read_body(self):
        if "chunked" in (self.headers.get("transfer-encoding") or "").lower():
            body = bytearray()
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return bytes(body)
                body += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def answer(self, status, body=b"", grpc_code=None, message=""):
        if grpc_code is not None:
            body = rpc_status(grpc_code, message)
        self.send_response(status)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.read_body()
        if self.collector.max_bytes and len(body) > self.collector.max_bytes:
            self.collector.write([{"refused": f"too large: {len(body)} bytes"}])
            return self.answer(413, grpc_code=8, message="request too large (--max-bytes)")
        signal_name = {"/v1/logs": "logs", "/v1/traces": "traces"}.get(self.path.split("?")[0])
        if signal_name is None:
            return self.answer(404, grpc_code=5, message=f"no such path {self.path}")
        ctype = (self.headers.get("content-type") or "").split(";")[0].strip().lower()
        if ctype != "application/x-protobuf":
            return self.answer(415, grpc_code=3, message=f"unsupported content-type {ctype!r}")
        encoding = (self.headers.get("content-encoding") or "identity").strip().lower()
        if encoding not in ("identity", "gzip"):
            return self.answer(415, grpc_code=3, message=f"unsupported content-encoding {encoding!r}")
        verdict = self.collector.check(lambda name: self.headers.get_all(name) or [])
        if verdict == "unauthenticated":
            return self.answer(401, grpc_code=16, message="missing header")
        if verdict == "unavailable":
            return self.answer(503, grpc_code=14, message="refused (--refuse)")
        request_type, response_type, to_lines = SIGNALS[signal_name]
        try:
            if encoding == "gzip":
                body = gzip.decompress(body)
            request = request_type.FromString(body)
        except Exception as e:
            log(f"POST {self.path}: undecodable body ({len(body)} bytes): {e}")
            return self.answer(400, grpc_code=3, message=f"undecodable: {e}")
        self.collector.write(to_lines(request))
        self.answer(200, response_type().SerializeToString())

    def do_GET(self):
        self.read_body()
        self.answer(404, grpc_code=5, message="POST /v1/logs or /v1/traces")

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_GET

    def do_HEAD(self):
        self.send_response(404)
        self.send_header("content-length", "0")
        self.end_headers()


def serve_http(collector, port, tls):
    HttpHandler.collector = collector
    server = ThreadingHTTPServer(("127.0.0.1", port), HttpHandler)
    server.daemon_threads = True
    if tls:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*tls)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    def stop():
        server.shutdown()
        server.server_close()

    return server.server_address[1], stop


# ---- OTLP/gRPC ---------------------------------------------------------------------------


def grpc_export(collector, signal_name, request, context):
    metadata = list(context.invocation_metadata() or [])

    def get_all(name):
        return [v if isinstance(v, str) else v.decode("latin-1")
                for k, v in metadata if k.lower() == name]

    verdict = collector.check(get_all)
    if verdict == "unauthenticated":
        context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing header")
    if verdict == "unavailable":
        context.abort(grpc.StatusCode.UNAVAILABLE, "refused (--refuse)")
    _, response_type, to_lines = SIGNALS[signal_name]
    collector.write(to_lines(request))
    return response_type()


class LogsService(logs_service_pb2_grpc.LogsServiceServicer):
    def __init__(self, collector):
        self.collector = collector

    def Export(self, request, context):
        return grpc_export(self.collector, "logs", request, context)


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, collector):
        self.collector = collector

    def Export(self, request, context):
        return grpc_export(self.collector, "traces", request, context)


def serve_grpc(collector, port, tls):
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        options=[("grpc.max_receive_message_length", collector.max_bytes or 64 * 1024 * 1024),
                 ("grpc.so_reuseport", 0)],
    )
    logs_service_pb2_grpc.add_LogsServiceServicer_to_server(LogsService(collector), server)
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(collector), server)
    if tls:
        with open(tls[0], "rb") as cert, open(tls[1], "rb") as key:
            credentials = grpc.ssl_server_credentials([(key.read(), cert.read())])
        bound = server.add_secure_port(f"127.0.0.1:{port}", credentials)
    else:
        bound = server.add_insecure_port(f"127.0.0.1:{port}")
    if not bound:
        raise OSError(f"cannot bind 127.0.0.1:{port}")
    server.start()

    def stop():
        server.stop(grace=1).wait()

    return bound, stop


# ---- main --------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description="OTLP collector stand-in for the tests.")
    parser.add_argument("--protocol", choices=["grpc", "http"], required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--header", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--refuse", type=int, default=0, metavar="N")
    parser.add_argument("--tls", nargs=2, metavar=("CERT", "KEY"), default=None)
    parser.add_argument("--max-bytes", type=int, default=0, metavar="N")
    args = parser.parse_args()
    headers = []
    for h in args.header:
        name, sep, value = h.partition("=")
        if not sep or not name:
            parser.error(f"--header wants NAME=VALUE, got {h!r}")
        headers.append((name.strip().lower(), name.strip(), value))

    # Every thread started from here on (the servers' too) inherits the block, so the signals
    # reach only the sigwait below.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    collector = Collector(args.out, headers, args.refuse)
    collector.max_bytes = args.max_bytes
    serve = serve_grpc if args.protocol == "grpc" else serve_http
    port, stop = serve(collector, args.port, args.tls)
    print(f"listening {port}", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
