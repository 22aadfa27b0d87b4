"""The I/O of one HTTP exchange: body, sends counted into the record, disconnects, faults.

Handlers are raw ASGI (Starlette's `StreamingResponse` would hide when the client went away).
An `Exchange` reads the body first; then `run(work)` runs the response under a watch on
`receive()`: when the client disconnects before the response is complete, the work is cancelled
at once — generation stops, as upstream aborts a request whose client went away (it polls once
a second; the simulator reacts at once and records the moment) — and the record says so.
A handler that returns without completing its response makes uvicorn close the connection:
that is how the simulator cuts a stream (`cut()`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, Final

import orjson
from starlette.types import Receive, Scope, Send

from proxy.simulator.completion_frames import DONE, error_frame
from proxy.simulator.engine import EngineOutput
from proxy.simulator.faults import Fault
from proxy.simulator.records import RequestRecord, SimulatorState

SSE_CONTENT_TYPE: Final = (b"content-type", b"text/event-stream; charset=utf-8")
JSON_CONTENT_TYPE: Final = (b"content-type", b"application/json")


class BodyTooLarge(Exception):
    """The request body is larger than the configured limit."""


class ClientGone(Exception):
    """The client disconnected before its request was read: there is no one to answer."""


class Exchange:
    """One request/response (module doc)."""

    def __init__(self, state: SimulatorState, scope: Scope, receive: Receive, send: Send) -> None:
        self.state = state
        self.scope = scope
        self.headers = {
            name.decode("latin-1").lower(): value.decode("latin-1")
            for name, value in scope["headers"]
        }
        self._receive = receive
        self._send = send
        self._due: float | None = None  # loop time the last engine output was due
        self.record: RequestRecord = state.open(
            scope["method"], scope["path"], self.headers.get("x-request-id")
        )
        # trtllm-serve continues this trace in its own spans (`--otlp_traces_endpoint`)
        self.record.traceparent = self.headers.get("traceparent")
        client = scope.get("client")
        self.record.peer = (str(client[0]), int(client[1])) if client else None

    async def body(self) -> bytes:
        """The whole request body (`BodyTooLarge` past the configured limit)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self.record.client_gone(self.state.monotonic())
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.state.config.max_body_bytes:
                raise BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    # -- sending ---------------------------------------------------------------------------------

    async def start(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        self.record.status = status
        await self._send(
            {"type": "http.response.start", "status": status, "headers": list(headers)}
        )

    async def write(self, chunk: bytes) -> None:
        """One body chunk, more to come."""
        self.record.frames_sent += 1
        await self._send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def finish(self, chunk: bytes = b"") -> None:
        """The last body chunk: the response is complete."""
        if chunk:
            self.record.frames_sent += 1
        self.record.close(self.state.monotonic(), completed=True)
        await self._send({"type": "http.response.body", "body": chunk, "more_body": False})

    def cut(self) -> None:
        """Give up the response half-sent: the handler returns, uvicorn drops the connection."""
        self.record.close(self.state.monotonic(), cut=True)

    async def json(
        self, status: int, payload: Any, headers: Iterable[tuple[bytes, bytes]] = ()
    ) -> None:
        body = orjson.dumps(payload)
        await self.start(
            status,
            [JSON_CONTENT_TYPE, (b"content-length", str(len(body)).encode()), *headers],
        )
        await self.finish(body)

    async def plain(self, status: int, text: str = "") -> None:
        body = text.encode()
        await self.start(
            status,
            [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
            ],
        )
        await self.finish(body)

    # -- running ---------------------------------------------------------------------------------

    async def run(self, work: Coroutine[Any, Any, None]) -> None:
        """Run the response; cancel it when the client disconnects first (module doc)."""
        state = self.state
        state.active += 1
        task = asyncio.ensure_future(work)
        watcher = asyncio.ensure_future(self._wait_disconnect())
        try:
            done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if task not in done and not self.record.completed:
                self.record.client_gone(state.monotonic())
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            else:
                await task  # re-raise the simulator's own errors
        finally:
            watcher.cancel()
            if not task.done():
                task.cancel()
            state.active -= 1
            if not self.record.closed:  # returned without completing: uvicorn drops it
                self.record.close(state.monotonic(), cut=True)

    async def _wait_disconnect(self) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass

    async def pace(self, seconds: float) -> None:
        """Wait until the engine has the next output: `seconds` after the previous one was due,
        on a schedule that starts with the request, so time spent sending does not slow the
        engine down (a busy server sends late, then catches up, as a real one does)."""
        now = asyncio.get_running_loop().time()
        if self._due is None:
            self._due = now
        self._due += seconds
        # Always yield, even when no time is due: with zero pacing `send` into a closed
        # connection returns at once and the disconnect watcher would never get to run.
        await asyncio.sleep(max(0.0, self._due - now))

    async def sleep(self, seconds: float) -> None:
        """Send nothing for `seconds` (a stall); the engine's schedule resumes afterwards."""
        if seconds > 0:
            await asyncio.sleep(seconds)
        self._due = None


class FaultPlan:
    """The stream faults of one request, fired in order of their token position."""

    def __init__(self, faults: Iterable[Fault]) -> None:
        self._pending = sorted(faults, key=lambda fault: fault.after)

    @property
    def positions(self) -> list[int]:
        return [fault.after for fault in self._pending]

    def due(self, sent: int) -> list[Fault]:
        """The faults to fire now that `sent` generated tokens are out."""
        due = [fault for fault in self._pending if fault.after <= sent]
        self._pending = self._pending[len(due) :]
        return due


async def fire(exchange: Exchange, faults: Iterable[Fault], *, malformed: bytes) -> str:
    """Fire due stream faults; "ended" when one ended the response (the caller returns),
    "strip" when the next frame must go without `token_ids`, "bad-logprobs" when its logprobs
    must be one short (completions only), else "go"."""
    result = "go"
    for fault in faults:
        exchange.record.faults.append(fault.spec)
        if fault.kind == "stall":
            await exchange.sleep(fault.seconds)
        elif fault.kind == "malformed":
            await exchange.write(malformed)
        elif fault.kind == "no-token-ids":
            result = "strip"
        elif fault.kind == "bad-logprobs":
            result = "bad-logprobs"
        elif fault.kind == "cut":
            exchange.cut()
            return "ended"
        elif fault.kind == "eof":
            await exchange.finish()
            return "ended"
        elif fault.kind == "done":
            await exchange.finish(DONE)
            return "ended"
        elif fault.kind == "error":
            await exchange.write(error_frame("simulated engine failure (X-Sim-Fault: error)"))
            await exchange.finish(DONE)
            return "ended"
    return result


async def stream_outputs(
    exchange: Exchange,
    outputs: Iterable[EngineOutput],
    plan: FaultPlan,
    send: Callable[[EngineOutput, str], Awaitable[bool]],
    *,
    malformed: bytes,
) -> str:
    """Stream the engine's `outputs` as the engine makes them. Before each: the faults due at the
    tokens sent so far fire (`malformed` is what a `malformed` fault writes), the output's delay
    passes and the iteration is counted; then `send(output, outcome)` writes it (`outcome` as
    `fire` says: "strip", "bad-logprobs" or "go") and answers False when that ended the
    response. Returns the outcome of the faults due after the last output: "ended" when the
    response ended before or there, and the caller returns."""
    sent = 0
    for output in outputs:
        outcome = await fire(exchange, plan.due(sent), malformed=malformed)
        if outcome == "ended":
            return outcome
        await exchange.pace(output.delay)
        exchange.state.iteration(len(output.token_ids), output.delay)
        if not await send(output, outcome):
            return "ended"
        exchange.record.deliver(output.token_ids)
        sent += len(output.token_ids)
    return await fire(exchange, plan.due(sent), malformed=malformed)


async def answer_body(exchange: Exchange, body: bytes, faults: Iterable[Fault]) -> None:
    """A whole JSON body (non-streaming): `stall` delays it, `malformed` sends half of it as if
    whole, `cut` sends half and drops the connection; other faults mean nothing here."""
    headers = [JSON_CONTENT_TYPE, (b"content-length", str(len(body)).encode())]
    for fault in faults:
        if fault.kind not in ("stall", "malformed", "cut"):
            continue
        exchange.record.faults.append(fault.spec)
        if fault.kind == "stall":
            await exchange.sleep(fault.seconds)
        elif fault.kind == "malformed":
            body = body[: len(body) // 2]
            headers[1] = (b"content-length", str(len(body)).encode())
        else:
            await exchange.start(200, headers)
            await exchange.write(body[: len(body) // 2])
            exchange.cut()
            return
    await exchange.start(200, headers)
    await exchange.finish(body)
