"""A render worker process: `python -m proxy.server.rendering.worker VOCAB_DIR`.

Theory of operation. openai-harmony holds the GIL while it renders, and its BPE is quadratic in
the length of one unbroken run of text (`"a" * 200_000` takes 12-29 s), so a render on the event
loop stalls every other stream, and a thread does not help. `render.RenderPool` runs
`prepare_request` in processes like this one instead. The worker loads the Harmony encoding once
(from the vocab folder the parent loaded it from), keeps its own `PrefixCache`, and then serves
one request at a time over its stdin/stdout pipes, in frames of a 4-byte big-endian length and a
payload:

    parent → worker   pickle(RenderOptions)                first frame, once: the options every
                                                         render takes (keys stay off argv)
                      orjson of the parsed request body (the dict `prepare` was given)
                      b"\x00" + traceparent (55 bytes) + the same, with traces on
    worker → parent   b"R"                                 ready (sent once, after loading)
                      b"O" + u32 n + pickle(light) + ids   a PreparedRequest (`encode_prepared`)
                      b"E" + orjson {status,message,param,code}   the ClientError it raised
                      b"X" + text                          anything else it raised (our bug)
                      b"P" + orjson {…}                    a 400 after a panic: the worker exits

openai-harmony can also *panic* on a costly input (a 1 MB run of one letter overflows the stack
of its regex: `pyo3_runtime.PanicException`, a BaseException; inline it used to answer 500). The
worker answers that as a 400 `render_failed` and then exits (state inside the Rust encoding is
not to be trusted after a panic); the pool starts a new one.

The prompt ids travel as packed uint32 (`array`), not pickled ints: 190,000 ids decode in ~2 ms
instead of ~11 ms, and that decode runs on the parent's event loop.

The worker ignores SIGINT and SIGTERM: a Ctrl-C or a signal to the whole process group must not
kill renders while the parent drains; the parent ends it (EOF on stdin, then SIGKILL), and a
worker whose parent died sees EOF and exits. File descriptor 1 is moved away from the protocol
pipe at start, so a stray write to stdout cannot corrupt a frame (it goes to stderr).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import pickle
import signal
import struct
import sys
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from proxy.errors import ClientError
from proxy.harmony.reasoning_seal import ReasoningKeys
from proxy.harmony.request.prefix import PrefixCache
from proxy.harmony.request.prepare import PreparedRequest, prepare_request
from proxy.tracing import TraceConfig, Tracing, start_tracing

HEADER = struct.Struct(">I")
READY = b"R"
PREPARED = b"O"
CLIENT_ERROR = b"E"
FAILURE = b"X"
PANICKED = b"P"
#: A request frame that starts with this byte carries the request's W3C traceparent (55 bytes)
#: before the body (a JSON body never starts with it).
TRACED = b"\x00"
TRACEPARENT_BYTES = 55


@dataclasses.dataclass(frozen=True, slots=True)
class RenderOptions:
    """What every render takes besides the body, the same inline and in a worker (plain data:
    the parent sends it pickled as a worker's first frame, never on its command line, since
    the keys are secrets)."""

    #: Open `encrypted_content` of input reasoning items.
    reasoning_keys: ReasoningKeys | None = None
    #: The model's context: prompt + `max_output_tokens` above it is a 400 or truncated.
    max_prompt_tokens: int | None = None
    #: Traces on: the worker exports a span per render under the request's (its own SDK).
    traces: TraceConfig | None = None

    def render(self, body: Any, encoding: Any, prefixes: PrefixCache | None) -> PreparedRequest:
        return prepare_request(
            body,
            encoding,
            prefixes=prefixes,
            reasoning_keys=self.reasoning_keys,
            max_prompt_tokens=self.max_prompt_tokens,
        )

    def encode(self) -> bytes:
        # The fields, not the object: in the worker this module runs as `__main__`, where a
        # pickled `proxy.server.rendering.worker.RenderOptions` would be another class.
        return pickle.dumps({f.name: getattr(self, f.name) for f in dataclasses.fields(self)})

    @staticmethod
    def decode(raw: bytes) -> RenderOptions:
        return RenderOptions(**pickle.loads(raw))  # from our parent, over our own pipe


def encode_prepared(prepared: PreparedRequest) -> bytes:
    """`PREPARED` payload: the request without its prompt ids (pickled), then the ids packed."""
    ids = prepared.prompt_token_ids
    body = prepared.completion_body
    if body.get("prompt") is ids:  # one list in two places: sent once, shared again on arrival
        body = {**body, "prompt": None}
    light = dataclasses.replace(prepared, prompt_token_ids=[], completion_body=body)
    meta = pickle.dumps(light, protocol=pickle.HIGHEST_PROTOCOL)
    return PREPARED + HEADER.pack(len(meta)) + meta + array("I", ids).tobytes()


def decode_prepared(payload: memoryview) -> PreparedRequest:
    """The inverse of `encode_prepared` (payload without its kind byte)."""
    (size,) = HEADER.unpack_from(payload)
    light: PreparedRequest = pickle.loads(payload[HEADER.size : HEADER.size + size])
    packed = array("I")
    packed.frombytes(payload[HEADER.size + size :])
    ids = packed.tolist()
    body = light.completion_body
    if "prompt" in body and body["prompt"] is None:
        body = {**body, "prompt": ids}
    return dataclasses.replace(light, prompt_token_ids=ids, completion_body=body)


def encode_error(error: ClientError) -> bytes:
    fields = {
        "status": error.status,
        "message": error.message,
        "param": error.param,
        "code": error.code,
    }
    return CLIENT_ERROR + orjson.dumps(fields)


def decode_error(payload: memoryview) -> ClientError:
    fields: dict[str, Any] = orjson.loads(payload)
    return ClientError(
        fields["message"], status=fields["status"], param=fields["param"], code=fields["code"]
    )


class Panicked(Exception):
    """openai-harmony panicked: the reply is sent, then the worker exits (module doc)."""

    def __init__(self, reply: bytes) -> None:
        super().__init__("openai-harmony panicked")
        self.reply = reply


def handle(
    raw: bytes, encoding: Any, prefixes: PrefixCache, options: RenderOptions | None = None
) -> bytes:
    """One request frame → one reply payload (never raises for what the client sent; raises
    `Panicked`, carrying the reply, when openai-harmony panicked)."""
    try:
        prepared = (options or RenderOptions()).render(orjson.loads(raw), encoding, prefixes)
    except ClientError as error:
        return encode_error(error)
    except Exception as exc:  # our bug: reported to the parent, which logs and answers it
        return FAILURE + f"{type(exc).__name__}: {exc}"[:500].encode("utf-8", "replace")
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | SystemExit | GeneratorExit):
            raise
        refusal = ClientError(
            "openai-harmony could not render this request (it failed on a very long run of "
            "text without whitespace or a similar costly input)",
            param="input",
            code="render_failed",
        )
        raise Panicked(PANICKED + encode_error(refusal)[1:]) from exc
    return encode_prepared(prepared)


def _read_exact(stream: BinaryIO, size: int) -> bytes | None:
    chunks = []
    while size:
        chunk = stream.read(size)
        if not chunk:
            return None
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _write(stream: BinaryIO, payload: bytes) -> None:
    stream.write(HEADER.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def serve(vocab_dir: Path, inbound: BinaryIO, outbound: BinaryIO) -> None:
    """Read the options, load the encoding, say ready, then answer frames until EOF."""
    from proxy import vocab  # here: the module's import is light for the parent

    header = _read_exact(inbound, HEADER.size)
    first = None if header is None else _read_exact(inbound, HEADER.unpack(header)[0])
    if first is None:
        return
    options = RenderOptions.decode(first)
    encoding = vocab.load_encoding(vocab_dir)
    prefixes = PrefixCache(encoding)
    tracing = None if options.traces is None else start_tracing(options.traces)
    gc.freeze()  # start-up's objects live as long as the process: no GC pass walks them
    _write(outbound, READY)
    try:
        while True:
            header = _read_exact(inbound, HEADER.size)
            if header is None:
                return
            raw = _read_exact(inbound, HEADER.unpack(header)[0])
            if raw is None:
                return
            try:
                with _span(tracing, raw) as raw:
                    reply = handle(raw, encoding, prefixes, options)
            except Panicked as panic:
                _write(outbound, panic.reply)
                return
            _write(outbound, reply)
    finally:
        if tracing is not None:
            tracing.shutdown()


@contextlib.contextmanager
def _span(tracing: Tracing | None, raw: bytes) -> Iterator[bytes]:
    """The body of a request frame, under a span continuing its traceparent when it has one."""
    if raw[:1] != TRACED:
        yield raw
        return
    parent, body = raw[1 : 1 + TRACEPARENT_BYTES], raw[1 + TRACEPARENT_BYTES :]
    if tracing is None:
        yield body
        return
    context = tracing.extract([(b"traceparent", parent)])
    with tracing.tracer.start_as_current_span("render worker", context):
        yield body


def traced_payload(payload: bytes) -> bytes:
    """`payload` with the current span's traceparent before it (`TRACED`), when there is one."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    parent = carrier.get("traceparent", "").encode()
    return TRACED + parent + payload if len(parent) == TRACEPARENT_BYTES else payload


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    outbound = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    inbound = os.fdopen(os.dup(0), "rb")
    serve(Path(argv[0]), inbound, outbound)
    return 0


if __name__ == "__main__":  # pragma: no cover - run as a child process by RenderPool
    raise SystemExit(main(sys.argv[1:]))
