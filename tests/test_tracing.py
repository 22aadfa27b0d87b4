"""Traces with the real OpenTelemetry SDK and its in-memory exporter: the proxy on loopback in
front of the simulator, called by the openai SDK. The span tree, names and attributes, the
context the simulator receives, background links, no content by default, trace ids in logs,
and nothing at all imported or made when tracing is off."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from openai import OpenAI
from openai_harmony import HarmonyEncoding
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from websockets.sync.client import connect

from proxy.config.settings import Settings
from proxy.server.app import create_app
from proxy.simulator.app import create_simulator_app
from proxy.simulator.config import SimulatorConfig
from proxy.store.memory import MemoryStore
from proxy.tracing import TraceConfig, Tracing, client_attributes, start_tracing
from tests.live import LiveServer, wait_for
from tests.mcp_servers import LOOPBACK, mcp_server

MODEL = "openai/gpt-oss-120b"
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"
SECRET = "the-prompt-says-swordfish"


@dataclasses.dataclass
class Traced:
    simulator: LiveServer
    proxy: LiveServer
    exporter: InMemorySpanExporter
    records: list[logging.LogRecord]

    def client(self) -> OpenAI:
        return OpenAI(base_url=self.proxy.url + "/v1", api_key="sk-secret-key", max_retries=0)

    def spans(self, count: int) -> list[ReadableSpan]:
        """At least `count` finished spans, the request's server span (which ends last) among
        them."""

        def done() -> bool:
            spans = self.exporter.get_finished_spans()
            return len(spans) >= count and any(s.kind is SpanKind.SERVER for s in spans)

        assert wait_for(done, 10)
        return list(self.exporter.get_finished_spans())

    def upstream_traceparents(self, path: str) -> list[str]:
        """The trace contexts upstream got on `path` (the capability probe's requests have
        none: they belong to no request)."""
        records = self.simulator.server.config.app.state.simulator.requests
        return [r.traceparent for r in records if r.path == path and r.traceparent]


class _Keep(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__()
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def traced(encoding: HarmonyEncoding, capture: bool = False, **overrides: Any) -> Iterator[Traced]:
    config = SimulatorConfig(stream_interval=4, token_seconds=0.001, first_token_seconds=0.001)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    records: list[logging.LogRecord] = []
    logger = logging.getLogger(f"tracing-test-{id(records)}")
    logger.addHandler(_Keep(records))
    logger.setLevel(logging.INFO)
    logger.propagate = False
    with LiveServer(create_simulator_app(config, encoding)) as simulator:
        settings = dataclasses.replace(
            Settings(upstream_url=simulator.url, render_workers=0), **overrides
        )
        tracing = Tracing(provider, capture_content=capture)
        app = create_app(settings, encoding, tracing=tracing, logger=logger, store=MemoryStore())
        with LiveServer(app) as proxy:
            assert wait_for(lambda: app.state.proxy.capability.token_ids, 10)
            exporter.clear()
            yield Traced(simulator, proxy, exporter, records)


def by_name(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def every_attribute(spans: list[ReadableSpan]) -> str:
    return repr(
        [(dict(s.attributes or {}), [dict(e.attributes or {}) for e in s.events]) for s in spans]
    )


def test_a_stream_continues_the_clients_trace_and_passes_it_upstream(
    encoding: HarmonyEncoding,
) -> None:
    with traced(encoding) as stack:
        client = stack.client()
        with client.responses.create(
            model=MODEL,
            input=SECRET,
            stream=True,
            max_output_tokens=64,
            temperature=0.5,
            extra_headers={"traceparent": TRACEPARENT, "x-request-id": "req-traced-1"},
        ) as stream:
            events = list(stream)
        client.close()
        assert events[-1].type in ("response.completed", "response.incomplete")
        spans = stack.spans(4)

    server = by_name(spans, f"chat {MODEL}")
    prepare = by_name(spans, "prepare")
    upstream = by_name(spans, "POST")
    assert server.kind is SpanKind.SERVER
    assert upstream.kind is SpanKind.CLIENT
    # continues the client's trace, as its child
    assert server.context is not None
    assert server.parent is not None
    assert f"{server.context.trace_id:032x}" == TRACE_ID
    assert f"{server.parent.span_id:016x}" == PARENT_ID
    for child in (prepare, upstream):
        assert child.parent is not None
        assert child.parent.span_id == server.context.span_id
    render = by_name(spans, "render")  # validation and rendering, inside prepare
    assert render.parent is not None
    assert prepare.context is not None
    assert render.parent.span_id == prepare.context.span_id
    # upstream got the CLIENT span's context: trtllm-serve's spans join this trace
    assert upstream.context is not None
    assert stack.upstream_traceparents("/v1/completions") == [
        f"00-{TRACE_ID}-{upstream.context.span_id:016x}-01"
    ]
    attributes = dict(server.attributes or {})
    response_id = events[-1].response.id
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == MODEL
    assert attributes["gen_ai.response.model"] == MODEL
    assert attributes["gen_ai.response.id"] == response_id
    assert attributes["gen_ai.request.max_tokens"] == 64
    assert attributes["gen_ai.request.temperature"] == 0.5
    usage = events[-1].response.usage
    assert usage is not None
    assert attributes["gen_ai.usage.input_tokens"] == usage.input_tokens
    assert attributes["gen_ai.usage.output_tokens"] == usage.output_tokens
    assert attributes["gen_ai.response.finish_reasons"] in (("stop",), ("length",))
    assert attributes["proxy.request_id"] == "req-traced-1"
    assert attributes["proxy.outcome"] == events[-1].response.status
    assert attributes["http.request.method"] == "POST"
    assert attributes["http.route"] == "/v1/responses"
    assert attributes["http.response.status_code"] == 200
    assert attributes["proxy.frames"] > 0
    assert attributes["proxy.tokens_per_frame"] > 0
    assert [e.name for e in server.events] == ["gen_ai.first_token", "proxy.terminal"]
    assert server.events[0].timestamp < server.events[1].timestamp
    upstream_attributes = dict(upstream.attributes or {})
    assert upstream_attributes["url.full"] == stack.simulator.url + "/v1/completions"
    assert upstream_attributes["http.response.status_code"] == 200
    # no content, no credential, by default
    dumped = every_attribute(spans)
    assert SECRET not in dumped
    assert "sk-secret-key" not in dumped
    assert "gen_ai.input.messages" not in dumped
    assert "gen_ai.output.messages" not in dumped
    # the request's log line leads to its trace
    lines = [r for r in stack.records if r.getMessage() == "request"]
    assert [vars(r).get("trace_id") for r in lines] == [TRACE_ID]
    assert vars(lines[0])["span_id"] == f"{server.context.span_id:016x}"


def test_content_is_captured_only_with_the_opt_in(encoding: HarmonyEncoding) -> None:
    with traced(encoding, capture=True) as stack:
        client = stack.client()
        response = client.responses.create(model=MODEL, input=SECRET, max_output_tokens=32)
        client.close()
        spans = stack.spans(4)
    server = by_name(spans, f"chat {MODEL}")
    attributes = dict(server.attributes or {})
    assert SECRET in str(attributes["gen_ai.input.messages"])
    assert response.output_text[:20] in str(attributes["gen_ai.output.messages"])
    assert "sk-secret-key" not in every_attribute(spans)


def test_a_new_trace_starts_without_a_client_context(encoding: HarmonyEncoding) -> None:
    with traced(encoding) as stack:
        client = stack.client()
        client.responses.create(model=MODEL, input="hi", max_output_tokens=16)
        client.close()
        spans = stack.spans(4)
    server = by_name(spans, f"chat {MODEL}")
    assert server.parent is None
    assert server.context is not None
    traceparent = stack.upstream_traceparents("/v1/completions")[0]
    assert traceparent is not None
    assert f"{server.context.trace_id:032x}" in traceparent


def test_pass_through_has_a_server_span_and_propagates(encoding: HarmonyEncoding) -> None:
    with traced(encoding) as stack:
        answer = httpx.get(
            stack.proxy.url + "/v1/models", headers={"traceparent": TRACEPARENT}, timeout=10
        )
        assert answer.status_code == 200
        spans = stack.spans(1)
    server = by_name(spans, "GET")
    assert server.kind is SpanKind.SERVER
    assert server.context is not None
    assert f"{server.context.trace_id:032x}" == TRACE_ID
    assert dict(server.attributes or {})["http.response.status_code"] == 200
    assert stack.upstream_traceparents("/v1/models") == [
        f"00-{TRACE_ID}-{server.context.span_id:016x}-01"
    ]


def test_a_background_response_has_its_own_span_linked_to_its_request(
    encoding: HarmonyEncoding,
) -> None:
    with traced(encoding) as stack:
        client = stack.client()
        queued = client.responses.create(
            model=MODEL,
            input="hi",
            background=True,
            max_output_tokens=16,
            extra_headers={"traceparent": TRACEPARENT},
        )
        assert wait_for(
            lambda: client.responses.retrieve(queued.id).status in ("completed", "incomplete"),
            10,
        )
        client.close()
        spans = stack.spans(4)
    runs = [s for s in spans if (s.attributes or {}).get("proxy.background")]
    assert len(runs) == 1
    run = runs[0]
    request = next(s for s in spans if s.kind is SpanKind.SERVER and s.name == f"chat {MODEL}")
    assert run.parent is None
    assert run.context is not None
    assert request.context is not None
    assert run.context.trace_id != request.context.trace_id  # a trace of its own
    assert [link.context.span_id for link in run.links] == [request.context.span_id]
    assert dict(run.attributes or {})["gen_ai.response.id"] == queued.id
    # its upstream call is in its own trace
    upstream = [s for s in spans if s.kind is SpanKind.CLIENT]
    assert upstream
    assert upstream[0].parent is not None
    assert upstream[0].parent.span_id == run.context.span_id


def test_tracing_is_on_only_with_an_endpoint() -> None:
    assert TraceConfig().resolved_endpoint({}) is None
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert TraceConfig().resolved_endpoint(env) == "http://collector:4318/v1/traces"
    grpc = {**env, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
    assert TraceConfig().resolved_endpoint(grpc) == "http://collector:4318"
    traces = {**env, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t:4318/v1/traces"}
    assert TraceConfig().resolved_endpoint(traces) == "http://t:4318/v1/traces"
    assert TraceConfig(endpoint="http://s:4318/v1/traces").resolved_endpoint({}) is not None
    assert TraceConfig().resolved_endpoint({**env, "OTEL_SDK_DISABLED": "true"}) is None
    assert TraceConfig().resolved_endpoint({**env, "OTEL_TRACES_EXPORTER": "none"}) is None
    assert start_tracing(TraceConfig(), {}) is None
    with pytest.raises(ValueError, match="http/json"):
        TraceConfig().resolved_protocol({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})
    assert not TraceConfig().captures({})
    assert TraceConfig().captures({"OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "true"})


def test_off_imports_nothing_of_opentelemetry() -> None:
    """With no endpoint, a served request (repaired path, pass-through) never imports the SDK
    or even the API: no span object can exist."""
    script = textwrap.dedent(
        """
        import os, sys
        for name in list(os.environ):
            if name.startswith("OTEL_"):
                del os.environ[name]
        from starlette.testclient import TestClient
        from proxy.config.settings import Settings
        from proxy.server.app import create_app
        from proxy.vocab import ensure_vocab, load_encoding
        settings = Settings(upstream_url="http://127.0.0.1:9", render_workers=0,
                            store_url="off", connect_timeout=0.5)
        app = create_app(settings, load_encoding(ensure_vocab(os.environ)))
        with TestClient(app) as client:
            client.post("/v1/responses", json={"model": "m", "input": "hi"})
            client.get("/v1/models")
        loaded = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
        print(loaded)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_genai_metrics_carry_the_trace_as_exemplar_in_openmetrics(
    encoding: HarmonyEncoding,
) -> None:
    with traced(encoding, metrics_models=(MODEL,)) as stack:
        client = stack.client()
        client.responses.create(
            model=MODEL,
            input="hi",
            max_output_tokens=32,
            extra_headers={"traceparent": TRACEPARENT},
        )
        client.close()
        openmetrics = httpx.get(
            stack.proxy.url + "/metrics",
            headers={"Accept": "application/openmetrics-text; version=1.0.0"},
            timeout=10,
        )
        plain = httpx.get(stack.proxy.url + "/metrics", timeout=10)
        spans = stack.spans(4)
    server = by_name(spans, f"chat {MODEL}")
    assert server.context is not None
    assert openmetrics.headers["content-type"].startswith("application/openmetrics-text")
    labels = (
        f'gen_ai_operation_name="chat",gen_ai_provider_name="tensorrt_llm",'
        f'gen_ai_request_model="{MODEL}"'
    )
    exemplar = f'# {{span_id="{server.context.span_id:016x}",trace_id="{TRACE_ID}"}}'
    for name in (
        "gen_ai_server_request_duration_seconds",
        "gen_ai_server_time_to_first_token_seconds",
        "gen_ai_server_time_per_output_token_seconds",
    ):
        lines = [
            line
            for line in openmetrics.text.splitlines()
            if line.startswith(name + "_bucket{") and labels in line
        ]
        assert lines, name
        assert any(exemplar in line for line in lines), lines
        assert name + "_count{" in plain.text
    # the convention's boundaries
    assert "gen_ai_server_time_to_first_token_seconds_bucket{" in plain.text
    assert 'le="0.001"' in plain.text
    assert 'le="81.92"' in plain.text
    assert "# {" not in plain.text  # no exemplars in Prometheus' text format


def test_store_reads_of_a_request_are_spans_under_it(encoding: HarmonyEncoding) -> None:
    with traced(encoding) as stack:
        client = stack.client()
        first = client.responses.create(model=MODEL, input="hi", max_output_tokens=16)
        stack.spans(4)
        stack.exporter.clear()
        client.responses.create(
            model=MODEL, input="and then?", previous_response_id=first.id, max_output_tokens=16
        )
        client.close()
        spans = stack.spans(6)  # two reads, render, prepare, the upstream call, the request
    prepare = by_name(spans, "prepare")
    store = [s for s in spans if s.name.startswith("store ")]
    assert store, [s.name for s in spans]
    assert prepare.context is not None
    reads = [
        s for s in store if s.parent is not None and s.parent.span_id == prepare.context.span_id
    ]
    assert reads, [(s.name, s.parent) for s in store]
    backends = {dict(s.attributes or {}).get("proxy.store_backend") for s in reads}
    assert backends == {"memory"}, [(s.name, s.attributes) for s in reads]
    server = by_name(spans, f"chat {MODEL}")
    assert dict(server.attributes or {})["proxy.previous_response_id"] == first.id


def test_each_websocket_turn_has_its_own_span_linked_to_the_handshake(
    encoding: HarmonyEncoding,
) -> None:
    url = "/v1/responses"
    with traced(encoding) as stack:
        with connect(
            stack.proxy.url.replace("http://", "ws://") + url,
            additional_headers={"traceparent": TRACEPARENT},
            open_timeout=5,
        ) as socket:
            for _ in range(2):
                create = {"type": "response.create", "model": MODEL, "input": "hi"}
                socket.send(json.dumps({**create, "max_output_tokens": 16}))
                while json.loads(socket.recv(timeout=10))["type"] not in TERMINAL:
                    pass
        spans = stack.spans(3)
    handshake = next(s for s in spans if s.kind is SpanKind.SERVER)
    turns = [s for s in spans if s.name == f"chat {MODEL}" and s.parent is None]
    assert len(turns) == 2, [s.name for s in spans]
    assert handshake.context is not None
    assert f"{handshake.context.trace_id:032x}" == TRACE_ID
    for turn in turns:
        assert turn.context is not None
        assert turn.context.trace_id != handshake.context.trace_id  # a trace of its own
        assert [link.context.span_id for link in turn.links] == [handshake.context.span_id]
        assert dict(turn.attributes or {})["gen_ai.request.model"] == MODEL
        assert SECRET not in every_attribute([turn])


TERMINAL = {"response.completed", "response.incomplete", "response.failed", "error"}


def test_a_hosted_mcp_call_is_a_client_span_under_its_request(encoding: HarmonyEncoding) -> None:
    tool = {
        "type": "mcp",
        "server_label": "tools",
        "require_approval": "never",
        "allowed_tools": ["echo"],
        "headers": {"authorization": "Bearer mcp-secret"},
    }
    with (
        mcp_server() as url,
        traced(encoding, **LOOPBACK) as stack,
    ):
        client = stack.client()
        response = client.responses.create(
            model=MODEL,
            input="say hello",
            tools=[{**tool, "server_url": url}],  # type: ignore[list-item]
            extra_headers={"traceparent": TRACEPARENT},
        )
        client.close()
        assert any(item.type == "mcp_call" for item in response.output)
        spans = stack.spans(3)
    request = next(s for s in spans if s.kind is SpanKind.SERVER)
    call = by_name(spans, "mcp echo")
    assert call.kind is SpanKind.CLIENT
    assert call.context is not None
    assert request.context is not None
    assert call.context.trace_id == request.context.trace_id
    attributes = dict(call.attributes or {})
    assert attributes["gen_ai.tool.name"] == "echo"
    assert attributes["proxy.mcp.server"] == "tools"
    assert "mcp-secret" not in every_attribute(spans)
    assert url not in every_attribute([call])


def test_a_hosted_mcp_call_of_a_websocket_turn_is_a_client_span_in_the_turns_trace(
    encoding: HarmonyEncoding,
) -> None:
    tool = {
        "type": "mcp",
        "server_label": "tools",
        "require_approval": "never",
        "allowed_tools": ["echo"],
        "headers": {"authorization": "Bearer mcp-secret"},
    }
    with (
        mcp_server() as url,
        traced(encoding, **LOOPBACK) as stack,
    ):
        with connect(stack.proxy.url.replace("http://", "ws://") + "/v1/responses") as socket:
            create = {"type": "response.create", "model": MODEL, "input": "over the socket"}
            socket.send(json.dumps({**create, "tools": [{**tool, "server_url": url}]}))
            kinds: list[str] = []
            while kinds[-1:] != ["response.completed"]:
                kinds.append(json.loads(socket.recv(timeout=10))["type"])
                assert kinds[-1] not in TERMINAL - {"response.completed"}, kinds
        spans = stack.spans(4)  # the handshake's ends with the socket
    assert "response.mcp_call.completed" in kinds
    turn = next(s for s in spans if s.name == f"chat {MODEL}" and s.parent is None)
    call = by_name(spans, "mcp echo")
    assert call.kind is SpanKind.CLIENT
    assert call.context is not None
    assert turn.context is not None
    assert call.context.trace_id == turn.context.trace_id
    assert "mcp-secret" not in every_attribute(spans)


def test_the_background_cancel_listener_makes_no_spans_in_a_request_trace(
    encoding: HarmonyEncoding, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The listener reads every run's entry each period; made inside the request that started
    # the first run, those reads would be spans of that request's trace, long after its end.
    monkeypatch.setattr("proxy.server.stateful.background.CHECK_PERIOD", 0.05)
    with traced(encoding) as stack:
        client = stack.client()
        queued = client.responses.create(
            model=MODEL,
            input="hi",
            background=True,
            max_output_tokens=16,
            extra_headers={"traceparent": TRACEPARENT, "X-Sim-Fault": "stall@2:1.5"},
        )
        assert wait_for(
            lambda: client.responses.retrieve(queued.id).status in ("completed", "incomplete"),
            10,
        )
        client.close()
        spans = stack.spans(4)
    request = next(s for s in spans if s.kind is SpanKind.SERVER and s.name == f"chat {MODEL}")
    assert request.context is not None
    assert request.end_time is not None
    late = [
        s.name
        for s in spans
        if s.context is not None
        and s.context.trace_id == request.context.trace_id
        and (s.start_time or 0) > request.end_time
    ]
    assert late == []


def test_upstream_credentials_in_its_url_never_reach_a_span() -> None:
    attributes = client_attributes("https://user:s3cret@up.example:8443/v1/completions")
    assert attributes["url.full"] == "https://REDACTED:REDACTED@up.example:8443/v1/completions"
    assert "s3cret" not in repr(attributes)
    assert "user" not in repr(attributes)
    assert attributes["server.address"] == "up.example"
    assert attributes["server.port"] == 8443
    plain = client_attributes("http://127.0.0.1:8000/v1/completions")
    assert plain["url.full"] == "http://127.0.0.1:8000/v1/completions"
    assert plain["server.port"] == 8000
