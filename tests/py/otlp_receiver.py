#!/usr/bin/env python3
"""An OTLP/HTTP trace receiver for tests, on the official protobuf definitions (the
`opentelemetry-proto` package): `POST /v1/traces` bodies are decoded as
ExportTraceServiceRequest and each span is appended to OUT as one JSON line:

    {"trace_id": hex, "span_id": hex, "parent_span_id": hex or "", "name": ..., "kind": int,
     "start": ns, "end": ns, "attributes": {...}, "events": [{"name", "attributes"}],
     "status": {"code": int, "message": str}, "resource": {...}, "scope": name}

It answers 200 with an empty ExportTraceServiceResponse. With --stall it accepts
connections and never reads or answers, as a collector that hangs.

    python3 tests/py/otlp_receiver.py PORT OUT [--stall]

PORT 0 takes a free port; the port is printed as `listening <port>` on stdout.
It listens on 127.0.0.1 only and runs until killed.
"""
import argparse
import json
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


def any_value(v):
    """An AnyValue as the JSON value it holds."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return attributes(v.kvlist_value.values)
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind)


def attributes(kvs):
    return {kv.key: any_value(kv.value) for kv in kvs}


def span_lines(request):
    """One dict per span of an ExportTraceServiceRequest."""
    for rs in request.resource_spans:
        resource = attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                yield {
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent_span_id": s.parent_span_id.hex(),
                    "name": s.name,
                    "kind": s.kind,
                    "start": s.start_time_unix_nano,
                    "end": s.end_time_unix_nano,
                    "attributes": attributes(s.attributes),
                    "events": [
                        {"name": e.name, "attributes": attributes(e.attributes)}
                        for e in s.events
                    ],
                    "status": {"code": s.status.code, "message": s.status.message},
                    "resource": resource,
                    "scope": ss.scope.name,
                }


def handler(out_path, lock):
    class Receiver(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            length = int(self.headers.get("content-length", "0"))
            body = self.rfile.read(length)
            if self.path != "/v1/traces":
                self.reply(404, b"")
                return
            request = ExportTraceServiceRequest()
            try:
                request.ParseFromString(body)
            except Exception as e:  # a body that is not the message: say so, keep serving
                self.reply(400, str(e).encode())
                return
            lines = "".join(json.dumps(s) + "\n" for s in span_lines(request))
            with lock, open(out_path, "a") as f:
                f.write(lines)
            self.reply(200, ExportTraceServiceResponse().SerializeToString())

        def reply(self, status, body):
            self.send_response(status)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    return Receiver


def stall(port):
    """Accepts connections and holds them open, never reading."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(64)
    print(f"listening {listener.getsockname()[1]}", flush=True)
    held = []
    while True:
        conn, _ = listener.accept()
        held.append(conn)


def main():
    p = argparse.ArgumentParser(description="OTLP/HTTP trace receiver for tests")
    p.add_argument("port", type=int)
    p.add_argument("out")
    p.add_argument("--stall", action="store_true")
    args = p.parse_args()
    if args.stall:
        stall(args.port)
        return
    server = ThreadingHTTPServer(("127.0.0.1", args.port), handler(args.out, threading.Lock()))
    server.daemon_threads = True
    print(f"listening {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit(0)
