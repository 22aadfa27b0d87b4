"""The private parts of dependencies the proxy relies on, checked to be there with the shape it
relies on, so that an upgrade which moves them fails here, loudly, with what to do — not as a
subtle misbehaviour of the guard or a slower parser. pyproject.toml bounds these dependencies
to the series checked here; raise a bound only after this file passes with the new version.

- uvicorn: `proxy/server/http/guard_protocol.py` and `closing.py` subclass `HttpToolsProtocol`,
  replace its `data_received`, extend five of its methods, read its per-connection state and
  the `RequestResponseCycle`s it makes, and write `STATUS_LINE`s; `proxy/server/http/
  forwarding.py` reads `ProxyHeadersMiddleware.trusted_hosts`; `proxy/server/processes/
  runner.py` overrides `Server.capture_signals`, `handle_exit` and `startup`; `proxy/server/
  http/closing.py` hands a WebSocket head to `handle_websocket_upgrade`, and `upgrade.py`
  extends the `websockets-sansio` protocol's `connection_lost` and `send`.
- openai-harmony: `proxy/harmony/stream/parser.py` feeds `StreamableParser._inner`, the
  compiled parser behind the Python wrapper, and reads its answers.
- httptools: `guard_protocol.py` and `proxy/upstream/http1.py` find the exception a parser
  callback raised in the `__context__` of the `HttpParserCallbackError`.

starlette and uvloop are used through their public API only (checked by every live test).
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import inspect
import textwrap
from collections import deque
from collections.abc import Callable
from importlib import metadata
from typing import Any

import httptools
import pytest
import uvicorn
import uvicorn.server
from openai_harmony import HarmonyEncoding, Role, StreamableParser
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle
from uvicorn.server import ServerState

UVICORN = metadata.version("uvicorn")
HARMONY = metadata.version("openai-harmony")
HTTPTOOLS = metadata.version("httptools")


def uvicorn_moved(what: str) -> str:
    return (
        f"uvicorn {UVICORN} changed {what}: re-check the overrides of GuardedProtocol "
        "(proxy/server/http/guard_protocol.py) and ClosingProtocol (closing.py) against "
        "uvicorn/protocols/http/httptools_impl.py, then update this test and raise uvicorn's "
        "bound in pyproject.toml"
    )


#: The uvicorn code the guard copies (`data_received`) or runs around (the methods it extends,
#: and the cycle whose transport it replaces), as sha256 of its source at the version tested.
#: Any change there needs a reader: the guard's copy may need the same change.
UVICORN_SOURCES = {
    "HttpToolsProtocol.__init__": "264f2f06759670d4",
    "HttpToolsProtocol.connection_made": "ba1915817ccf6c1b",
    "HttpToolsProtocol.connection_lost": "21bb5222b35990e7",
    "HttpToolsProtocol.data_received": "02c2572f1df55907",
    "HttpToolsProtocol.on_headers_complete": "7e259152e5aade71",
    "HttpToolsProtocol.on_message_complete": "377f9122ee6f3ab8",
    "HttpToolsProtocol.on_response_complete": "5684fd801d0683ac",
    "HttpToolsProtocol._start_asgi_task": "7b5e573c86b798b0",
    "HttpToolsProtocol._unset_keepalive_if_required": "58f4ffce604d92dd",
    "HttpToolsProtocol.send_400_response": "0b0d3ace8d263788",
    "HttpToolsProtocol.handle_websocket_upgrade": "9eedd6b3bd8e5780",
    "HttpToolsProtocol._should_upgrade": "ae8ade68aa39944a",
    "RequestResponseCycle": "e67d470d435dcc1c",
}


def _source_hash(qualified: str) -> str:
    target: Any = httptools_impl
    for part in qualified.split("."):
        target = getattr(target, part)
    source = textwrap.dedent(inspect.getsource(target))
    return hashlib.sha256(source.encode()).hexdigest()[:16]


@pytest.mark.parametrize("qualified", sorted(UVICORN_SOURCES))
def test_the_uvicorn_code_the_guard_copies_or_extends_is_the_code_it_was_written_against(
    qualified: str,
) -> None:
    assert _source_hash(qualified) == UVICORN_SOURCES[qualified], uvicorn_moved(qualified)


#: uvicorn's WebSocket protocol, which http/upgrade.py extends (the count, the bounded send
#: reading `writable`, `disconnected` and `transport`), as sha256 of its source.
UVICORN_WEBSOCKET_SOURCES = {
    "__init__": "cdad078596a7c53a",
    "connection_made": "453e89b605d1ec7b",
    "connection_lost": "bf96e8d2c2929c88",
    "send": "c5511914bfc5e4c2",
    "shutdown": "acb3a22483920bf2",
    "pause_writing": "706981ee7dc59872",
    "resume_writing": "0c0d433fc901eba0",
}


@pytest.mark.parametrize("name", sorted(UVICORN_WEBSOCKET_SOURCES))
def test_the_uvicorn_websocket_code_the_upgrade_extends_is_the_code_it_was_written_against(
    name: str,
) -> None:
    from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

    source = textwrap.dedent(inspect.getsource(getattr(WebSocketsSansIOProtocol, name)))
    found = hashlib.sha256(source.encode()).hexdigest()[:16]
    assert found == UVICORN_WEBSOCKET_SOURCES[name], uvicorn_moved(
        f"WebSocketsSansIOProtocol.{name} (re-check proxy/server/http/upgrade.py)"
    )


def test_the_uvicorn_methods_the_guard_extends_take_what_it_passes() -> None:
    expected: dict[str, list[str]] = {
        "__init__": ["self", "config", "server_state", "app_state", "_loop"],
        "connection_made": ["self", "transport"],
        "connection_lost": ["self", "exc"],
        "data_received": ["self", "data"],
        "on_headers_complete": ["self"],
        "on_message_complete": ["self"],
        "on_response_complete": ["self"],
        "_start_asgi_task": ["self", "cycle", "app"],
        "_unset_keepalive_if_required": ["self"],
        "send_400_response": ["self", "msg"],
        "_unsupported_upgrade_warning": ["self"],
    }
    for name, parameters in expected.items():
        method = getattr(HttpToolsProtocol, name, None)
        assert method is not None, uvicorn_moved(f"HttpToolsProtocol.{name} (gone)")
        found = list(inspect.signature(method).parameters)
        assert found == parameters, uvicorn_moved(f"the parameters of HttpToolsProtocol.{name}")
    for status in (400, 408, 413, 431, 503):
        line = httptools_impl.STATUS_LINE.get(status)
        assert isinstance(line, bytes), uvicorn_moved("STATUS_LINE")
        assert line.startswith(b"HTTP/1.1 %d " % status), uvicorn_moved("STATUS_LINE")
        assert line.endswith(b"\r\n"), uvicorn_moved("STATUS_LINE")


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = b""
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 5555)}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += bytes(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def test_the_per_connection_state_the_guard_reads_is_there() -> None:
    """One request through a real `HttpToolsProtocol`, with every attribute the guard reads
    checked on the way (their names, types and the order of the pipeline queue)."""
    started: list[tuple[RequestResponseCycle, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    class Recording(HttpToolsProtocol):
        def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
            started.append((cycle, app))
            super()._start_asgi_task(cycle, app)

    async def run() -> None:
        config = uvicorn.Config(app, http="httptools", ws="none", log_config=None)
        state = ServerState()
        protocol = Recording(config=config, server_state=state, app_state={})
        check: Callable[[bool, str], None] = _checker()
        check(protocol.loop is asyncio.get_running_loop(), "HttpToolsProtocol.loop")
        check(isinstance(protocol.parser, httptools.HttpRequestParser), "HttpToolsProtocol.parser")
        check(isinstance(protocol.pipeline, deque), "HttpToolsProtocol.pipeline (a deque)")
        check(protocol.cycle is None, "HttpToolsProtocol.cycle (None before a request)")
        check(isinstance(protocol.timeout_keep_alive, int), "HttpToolsProtocol.timeout_keep_alive")
        check(protocol.logger.name == "uvicorn.error", "HttpToolsProtocol.logger")
        check(protocol.server_state is state, "HttpToolsProtocol.server_state")
        check(isinstance(state.default_headers, list), "ServerState.default_headers")
        transport = _Transport()
        protocol.connection_made(transport)
        check(protocol.transport is transport, "HttpToolsProtocol.transport")
        check(protocol.flow.read_paused is False, "HttpToolsProtocol.flow.read_paused")
        check(callable(protocol.flow.resume_reading), "HttpToolsProtocol.flow.resume_reading")
        protocol.data_received(b"GET /x?y=1 HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n\r\n")
        check(protocol.url == b"/x?y=1", "HttpToolsProtocol.url")
        check(protocol.headers == [(b"host", b"h"), (b"x-a", b"1")], "HttpToolsProtocol.headers")
        cycle = protocol.cycle
        check(started[0][0] is cycle, "_start_asgi_task(cycle, app)")
        for name, kind in [
            ("response_started", bool),
            ("response_complete", bool),
            ("disconnected", bool),
            ("keep_alive", bool),
            ("message_event", asyncio.Event),
        ]:
            check(isinstance(getattr(cycle, name, None), kind), f"RequestResponseCycle.{name}")
        check(cycle.transport is transport, "RequestResponseCycle.transport")
        # A pipelined request waits in the queue: newest at the left, next to run at the right.
        protocol.data_received(
            b"GET /2 HTTP/1.1\r\nHost: h\r\n\r\nGET /3 HTTP/1.1\r\nHost: h\r\n\r\n"
        )
        check(len(protocol.pipeline) == 2, "HttpToolsProtocol.pipeline (queued requests)")
        newest, _app = protocol.pipeline[0]
        check(newest is protocol.cycle, "HttpToolsProtocol.pipeline (appendleft of the newest)")
        while protocol.pipeline or not protocol.cycle.response_complete:
            await asyncio.sleep(0.01)
        count = state.total_requests
        check(count == 3, "ServerState.total_requests (counted by on_response_complete)")
        check(transport.written.count(b"HTTP/1.1 200 OK\r\n") == 3, "the cycle's writes")
        # The guard's own attributes are in slots (closing.py) so that uvicorn's stay within the
        # 30 keys an instance dict shares with its class's: one dict per connection less.
        check(len(vars(protocol)) <= 30, "the attributes of HttpToolsProtocol (at most 30)")
        protocol.connection_lost(None)

    asyncio.run(run())


def _checker() -> Callable[[bool, str], None]:
    def check(holds: bool, what: str) -> None:
        assert holds, uvicorn_moved(what)

    return check


def test_forwarding_reads_the_trusted_hosts_of_uvicorns_middleware() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        pass

    middleware = ProxyHeadersMiddleware(app, trusted_hosts=["10.0.0.0/8", "127.0.0.1"])
    trusted = getattr(middleware, "trusted_hosts", None)
    assert trusted is not None, uvicorn_moved("ProxyHeadersMiddleware.trusted_hosts")
    assert "10.1.2.3" in trusted, uvicorn_moved("ProxyHeadersMiddleware.trusted_hosts' `in`")
    assert "127.0.0.1" in trusted, uvicorn_moved("ProxyHeadersMiddleware.trusted_hosts' `in`")
    assert "192.168.0.1" not in trusted, uvicorn_moved("ProxyHeadersMiddleware.trusted_hosts")


def test_the_server_hooks_the_drain_overrides() -> None:
    def server_moved(what: str) -> str:
        return (
            f"uvicorn {UVICORN} changed Server.{what}: re-check DrainingServer and QuietServer "
            "(proxy/server/processes/runner.py) against uvicorn/server.py, then raise the bound"
        )

    # Read from uvicorn's source, not the class: sse-starlette (a test dependency) replaces
    # Server.handle_exit with a wrapper of its own once imported.
    module = ast.parse(inspect.getsource(uvicorn.server))
    (server_class,) = [
        node for node in module.body if isinstance(node, ast.ClassDef) and node.name == "Server"
    ]
    methods = {
        node.name: [argument.arg for argument in node.args.args]
        for node in server_class.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    for name, parameters in [
        ("capture_signals", ["self"]),
        ("handle_exit", ["self", "sig", "frame"]),
        ("startup", ["self", "sockets"]),
        ("serve", ["self", "sockets"]),
    ]:
        assert methods.get(name) == parameters, server_moved(name)
    server = uvicorn.Server(uvicorn.Config(lambda scope, receive, send: None))
    assert server.started is False, server_moved("started")
    assert server.should_exit is False, server_moved("should_exit")
    with server.capture_signals() as captured:  # a context manager, as QuietServer's is
        assert captured is None, server_moved("capture_signals")


def test_the_compiled_harmony_parser_behind_the_wrapper(encoding: HarmonyEncoding) -> None:
    def moved(what: str) -> str:
        return (
            f"openai-harmony {HARMONY} changed {what}: HarmonyParser._delegate "
            "(proxy/harmony/stream/parser.py) feeds StreamableParser._inner and reads its "
            "answers; re-check it (it falls back to the slower wrapper when `_inner` is gone), "
            "then update this test and raise openai-harmony's bound in pyproject.toml"
        )

    wrapper = StreamableParser(encoding, Role.ASSISTANT)
    inner = getattr(wrapper, "_inner", None)
    assert inner is not None, moved("StreamableParser._inner (gone)")
    reference = StreamableParser(encoding, Role.ASSISTANT)
    text = "<|channel|>final<|message|>Hi there<|end|><|start|>assistant to=functions.f<|message|>"
    for token in encoding.encode(text, allowed_special="all"):
        inner.process(token)
        reference.process(token)
        assert inner.last_content_delta == reference.last_content_delta, moved(
            "_inner.last_content_delta"
        )
        assert inner.current_channel == reference.current_channel, moved("_inner.current_channel")
        assert inner.current_recipient == reference.current_recipient, moved(
            "_inner.current_recipient"
        )
        role = inner.current_role  # a plain string, which parser.py turns into a Role
        assert role is None or isinstance(role, str), moved("_inner.current_role (a str)")
        assert (Role(role) if role is not None else None) == reference.current_role, moved(
            "_inner.current_role"
        )
    assert reference.current_recipient == "functions.f"


def test_httptools_chains_a_callbacks_exception() -> None:
    class Stop(Exception):
        pass

    class Callbacks:
        def on_header(self, name: bytes, value: bytes) -> None:
            raise Stop

    parser = httptools.HttpResponseParser(Callbacks())
    with pytest.raises(httptools.HttpParserCallbackError) as caught:
        parser.feed_data(b"HTTP/1.1 200 OK\r\nX-A: 1\r\n\r\n")
    assert isinstance(caught.value.__context__, Stop), (
        f"httptools {HTTPTOOLS} no longer puts a callback's exception in the __context__ of "
        "HttpParserCallbackError: GuardedProtocol.data_received (proxy/server/http/"
        "guard_protocol.py) and ResponseReader._execute (proxy/upstream/http1.py) read it "
        "there to tell their own refusals from parse errors; re-check both, then raise "
        "httptools' bound in pyproject.toml"
    )


def test_the_guards_own_state_adds_no_dict_keys() -> None:
    """`GuardedProtocol` and `ClosingProtocol` keep their state in slots: a connection's dict
    holds uvicorn's attributes alone (the check above bounds those)."""
    from proxy.server.http.guard import Guard, Limits

    async def app(scope: Any, receive: Any, send: Any) -> None:
        return None

    async def run() -> None:
        config = uvicorn.Config(app, http="httptools", ws="none", log_config=None)
        limits = Limits(65536, 100, 5.0, 5.0, 1.0, 5.0, 1000, 30.0, 1 << 20, 20.0)
        state = ServerState()
        guarded = Guard(limits).protocol()(config=config, server_state=state, app_state={})
        plain = HttpToolsProtocol(config=config, server_state=state, app_state={})
        assert set(vars(guarded)) == set(vars(plain))

    asyncio.run(run())
