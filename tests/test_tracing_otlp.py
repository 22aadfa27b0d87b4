"""A real `serve` process exporting its traces over OTLP/HTTP (the SDK's exporter) to a receiver
on loopback started here, which decodes each `ExportTraceServiceRequest` with
opentelemetry-proto: the span tree, names and attributes, the context the simulator receives,
no content by default, trace ids in the logs; and a collector that is down or never answers
costs the requests nothing. The gRPC exporter, to a TraceService on loopback."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
import httpx
from openai import OpenAI
from openai_harmony import HarmonyEncoding
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from proxy.simulator.app import create_simulator_app
from proxy.simulator.config import SimulatorConfig
from proxy.tracing import TraceConfig, start_tracing
from tests.live import LiveServer, free_port, wait_for
from tests.test_serve_cli import start

MODEL = "openai/gpt-oss-120b"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"
SECRET = "a-prompt-nobody-may-read"
#: Export at once rather than every 5 s, so the test need not wait.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "50"}


class Receiver(ThreadingHTTPServer):
    """An OTLP/HTTP traces receiver: every span of every export, with its resource."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.spans: list[tuple[dict[str, Any], Span]] = []
        self.paths: list[str] = []
        self.types: list[str] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1/traces"


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        self.server.paths.append(self.path)
        self.server.types.append(self.headers["Content-Type"])
        for resource_spans in request.resource_spans:
            resource = attributes_of(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                self.server.spans.extend((resource, span) for span in scope_spans.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def attributes_of(pairs: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for pair in pairs:
        value = pair.value
        kind = value.WhichOneof("value")
        if kind == "array_value":
            found[pair.key] = [getattr(v, v.WhichOneof("value")) for v in value.array_value.values]
        else:
            found[pair.key] = getattr(value, kind) if kind else None
    return found


@contextmanager
def receiving() -> Iterator[Receiver]:
    receiver = Receiver()
    thread = threading.Thread(target=receiver.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        receiver.shutdown()
        receiver.server_close()


@contextmanager
def simulator(encoding: HarmonyEncoding) -> Iterator[LiveServer]:
    config = SimulatorConfig(stream_interval=4, token_seconds=0.001, first_token_seconds=0.001)
    with LiveServer(create_simulator_app(config, encoding)) as server:
        yield server


@contextmanager
def serving(upstream: str, **env: str) -> Iterator[tuple[str, list[bytes]]]:
    """A `serve` process (JSON logs); yields its URL and, once it has ended, its stderr."""
    process, url = start("--upstream", upstream, "--log-format", "json", **env)
    err: list[bytes] = []
    try:
        yield url, err
    finally:
        stopping = time.monotonic()
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=30)
        err.append(stderr)
        # the last spans' export is bounded (2 s): a dead collector never holds up the exit
        assert time.monotonic() - stopping < 6


def ask(url: str, **headers: str) -> Any:
    with OpenAI(base_url=url + "/v1", api_key="sk-live-secret", max_retries=0) as client:
        return client.responses.create(
            model=MODEL, input=SECRET, max_output_tokens=32, extra_headers=headers
        )


def test_serve_exports_the_span_tree_over_otlp_http(encoding: HarmonyEncoding) -> None:
    with receiving() as receiver, simulator(encoding) as upstream:
        env = {
            **FAST_EXPORT,
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url.removesuffix("/v1/traces"),
            "OTEL_SERVICE_NAME": "proxy-under-test",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=test",
        }
        with serving(upstream.url, **env) as (url, err):
            response = ask(url, traceparent=TRACEPARENT, **{"X-Request-Id": "otlp-1"})
            names = lambda: {span.name for _, span in receiver.spans}  # noqa: E731
            assert wait_for(lambda: {f"chat {MODEL}", "prepare", "render", "POST"} <= names(), 10)
        records = upstream.server.config.app.state.simulator.requests
        sent = [r.traceparent for r in records if r.path == "/v1/completions" and r.traceparent]

    assert set(receiver.paths) == {"/v1/traces"}
    assert set(receiver.types) == {"application/x-protobuf"}
    resource = receiver.spans[0][0]
    assert resource["service.name"] == "proxy-under-test"
    assert resource["deployment.environment.name"] == "test"
    spans = {span.name: span for _, span in receiver.spans}
    server, prepare, client = spans[f"chat {MODEL}"], spans["prepare"], spans["POST"]
    assert server.kind == Span.SPAN_KIND_SERVER
    assert client.kind == Span.SPAN_KIND_CLIENT
    assert {s.trace_id.hex() for s in (server, prepare, client)} == {TRACE_ID}
    assert server.parent_span_id.hex() == "b7ad6b7169203331"
    assert prepare.parent_span_id == server.span_id == client.parent_span_id
    assert spans["render"].parent_span_id == prepare.span_id
    assert sent == [f"00-{TRACE_ID}-{client.span_id.hex()}-01"]
    attributes = attributes_of(server.attributes)
    assert attributes["gen_ai.response.id"] == response.id
    assert attributes["gen_ai.provider.name"] == "tensorrt_llm"
    assert attributes["gen_ai.usage.output_tokens"] == response.usage.output_tokens
    assert attributes["proxy.request_id"] == "otlp-1"
    assert [event.name for event in server.events] == ["gen_ai.first_token", "proxy.terminal"]
    dumped = str([attributes_of(s.attributes) for _, s in receiver.spans])
    assert SECRET not in dumped
    assert "sk-live-secret" not in dumped
    lines = [json.loads(line) for line in err[0].splitlines() if line.startswith(b"{")]
    request_lines = [line for line in lines if line["msg"] == "request"]
    assert [line.get("trace_id") for line in request_lines] == [TRACE_ID]
    assert request_lines[0]["span_id"] == server.span_id.hex()


@contextmanager
def silent_collector() -> Iterator[str]:
    """A collector that takes connections and never answers (its backlog, never accepted)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1/traces"
    finally:
        listener.close()


def test_a_dead_or_silent_collector_costs_requests_nothing(encoding: HarmonyEncoding) -> None:
    closed = f"http://127.0.0.1:{free_port()}/v1/traces"
    with simulator(encoding) as upstream, silent_collector() as silent:
        for endpoint in (closed, silent):
            env = {**FAST_EXPORT, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint}
            with serving(upstream.url, **env) as (url, _):
                took = []
                for _ in range(10):
                    began = time.monotonic()
                    assert ask(url).status in ("completed", "incomplete")
                    took.append(time.monotonic() - began)
                assert httpx.get(url + "/readyz", timeout=5).status_code == 200
            # every request as quick as without tracing: no export on the request's way
            assert sorted(took)[len(took) // 2] < 0.5, took
            assert max(took) < 2, took


class _TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[Span] = []

    def Export(self, request: ExportTraceServiceRequest, context: Any) -> Any:
        for resource_spans in request.resource_spans:
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend(scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()


def test_grpc_is_the_other_protocol() -> None:
    """`otel_protocol = grpc` (or OTEL_EXPORTER_OTLP_PROTOCOL=grpc): the SDK's gRPC exporter, to
    a TraceService on loopback."""
    service = _TraceService()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"}
        tracing = start_tracing(TraceConfig(protocol="grpc"), env)
        assert tracing is not None
        with tracing.span("checked"):
            pass
        tracing.shutdown()
        assert wait_for(lambda: [s.name for s in service.spans] == ["checked"], 10)
    finally:
        server.stop(None)


def test_the_render_worker_exports_its_span_under_the_request(encoding: HarmonyEncoding) -> None:
    """A body past the inline bound renders in the render worker process, whose own exporter
    sends its span, a child of the request's `render` span, to the same collector."""
    with receiving() as receiver, simulator(encoding) as upstream:
        env = {**FAST_EXPORT, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url}
        with serving(upstream.url, **env) as (url, _):
            long_input = " ".join(["a word of a long prompt"] * 200)  # past 2 KiB: a worker
            with OpenAI(base_url=url + "/v1", api_key="sk", max_retries=0) as client:
                client.responses.create(model=MODEL, input=long_input, max_output_tokens=16)
            names = lambda: {span.name for _, span in receiver.spans}  # noqa: E731
            assert wait_for(lambda: {"render worker", f"chat {MODEL}"} <= names(), 15)
    spans = {span.name: span for _, span in receiver.spans}
    worker, render = spans["render worker"], spans["render"]
    assert worker.trace_id == render.trace_id == spans[f"chat {MODEL}"].trace_id
    assert worker.parent_span_id == render.span_id
    assert "a word of a long prompt" not in str(receiver.spans)


def test_a_protocol_the_proxy_cannot_export_fails_at_start() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROXY_", "OTEL_"))}
    env |= {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
    }
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "serve", "--port", str(free_port())],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert b"OTEL_EXPORTER_OTLP_PROTOCOL='http/json'" in result.stderr
    assert b"Traceback" not in result.stderr
