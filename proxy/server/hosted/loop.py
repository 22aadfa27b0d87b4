"""The hosted-tool loop: generate, and when the model calls an MCP tool run it and generate
again with its result — upstream passes that the client sees as one response.

Each pass is an `Exchange` whose events are rewritten on their way out: one `response.created`
and `in_progress` (the first pass's), one terminal event (the last pass's, its `output` all the
passes' items, its `usage` their sum), dense sequence numbers and output indices across passes,
and the `tools` echo with each `mcp` tool as declared, without its credentials. A call to an MCP
tool is not shown as a `function_call`: it becomes an `mcp_call` item (its events streamed while
it runs), or an `mcp_approval_request` that ends the response. A call fails as data (an
`mcp_call` with `error`), never as an HTTP error or a hung stream: every call is bounded by
`mcp_call_timeout`.

The loop is bounded by the call budget (plan.py: `max_tool_calls` or `mcp_max_calls`, the
smaller) and `mcp_loop_timeout`. Once either is spent, the next pass is rendered with the MCP
tools withdrawn (`tool_choice` auto), so the model answers in text. A call the model makes
when no call may run is never run nor dropped unseen: it is an `mcp_call` with status
`incomplete` and an error saying why; made on a pass that still offered the tools (the time ran
out during it), the model is told so on one more, withdrawn, pass; made on a withdrawn pass, the
response ends there, `completed`, with that item last.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from proxy.errors import ProxyError
from proxy.harmony.mcp import declare, items
from proxy.harmony.request.inputs import as_items
from proxy.harmony.request.prepare import PreparedRequest
from proxy.harmony.stream.events import OPENING_EVENTS, TERMINAL_EVENTS, error_event
from proxy.server.exchange import Exchange
from proxy.server.hosted.plan import Plan
from proxy.server.hosted.tools import Hosted

Event = dict[str, Any]
Emit = Callable[[list[Event]], Awaitable[None]]
Batches = AsyncGenerator[list[Event], None]


class Loop:
    """One response over several passes (module doc). `emit` writes a batch ([]: a keepalive)."""

    def __init__(
        self,
        hosted: Hosted,
        plan: Plan,
        first: Exchange,
        render: Callable[[dict[str, Any]], Awaitable[PreparedRequest]],
        make: Callable[[PreparedRequest], Exchange],
        keepalive: float,
    ) -> None:
        self.hosted, self.plan, self.first = hosted, plan, first
        self.render, self.make, self.keepalive = render, make, keepalive
        self.output: list[dict[str, Any]] = []
        self.sequence = 0
        self.usage: dict[str, Any] | None = None
        self.calls = 0
        self.snapshot: dict[str, Any] | None = None
        self.tools_echo: list[Any] | None = None
        #: The first pass's response object: what the client was told at `response.created`.
        self.head: dict[str, Any] | None = None
        #: The last terminal event seen (to end the response from, e.g. when a pass breaks).
        self.last: Event | None = None
        #: The pass being read: after its terminal event, its tail is read (`_finish_pass`).
        self._current: Batches | None = None

    async def run(self, emit: Emit, *, generate: bool = True) -> None:
        """Answer; `generate=False` settles the response from the plan alone, no upstream
        pass (a WebSocket warm-up)."""
        exchange = self.first
        batches = exchange.batches() if generate else _settled(exchange)
        opening, withdrawn = True, self.plan.withdrawn
        self.calls = self.plan.calls
        try:
            await self._passes(emit, batches, opening=opening, withdrawn=withdrawn)
        finally:
            current, self._current = self._current, None
            if current is not None:  # cancelled, or broken: its connection is closed
                await current.aclose()

    async def _passes(
        self, emit: Emit, batches: Batches, *, opening: bool, withdrawn: bool
    ) -> None:
        body = self.plan.body
        while True:
            self._current = batches
            try:
                terminal, calls, kept = await self._pass(batches, emit, opening=opening)
            except ProxyError as error:
                if opening or self.last is None:
                    raise  # before the first byte: the route answers the HTTP error
                await self._end(
                    emit, self.last, failure=(error.code or "upstream_error", str(error))
                )
                return
            opening = False
            if terminal is None:
                return
            self.last = terminal
            self._add_usage(terminal["response"].get("usage"))
            if terminal["type"] != "response.completed" or not calls:
                await self._end(emit, terminal)
                return
            call = calls[0]  # gpt-oss stops at its first call (`<|call|>`)
            await self._finish_pass()
            spent = self._spent()
            if spent is not None:
                result: dict[str, Any] | None = await self._unrun(emit, call, spent)
                if withdrawn:  # it had no MCP tool to call: the response ends here
                    await self._end(emit, terminal)
                    return
            else:
                result = await self._run_call(emit, call)
            if result is None:  # approval asked: the response ends here
                await self._end(emit, terminal)
                return
            history = [*as_items(body.get("input")), *kept, *items.as_input(result)]
            body = {**body, "input": history}
            if self.plan.tool_choice is not None:
                body["tool_choice"] = "auto"  # the forced call was made
            withdrawn = self._spent() is not None
            try:
                if withdrawn:
                    rendered = await self.render(self.plan.withdraw(body))
                    prepared = self.plan.reading_calls(rendered)
                else:
                    prepared = await self.render(body)
                exchange = self.make(prepared)
            except ProxyError as error:
                await self._end(
                    emit, terminal, failure=(error.code or "invalid_request", str(error))
                )
                return
            batches = exchange.batches()

    def _spent(self) -> str | None:
        """Why no call may run now (None: one may); the time counts from the plan's start."""
        return self.plan.spent(self.hosted, self.calls)

    async def _unrun(self, emit: Emit, call: dict[str, Any], reason: str) -> dict[str, Any]:
        """The model's call, shown and not run (module doc)."""
        label = call["namespace"]
        item = items.unrun_call_item(
            self.hosted.ids("mcp"), label, call["name"], call.get("arguments") or "", reason
        )
        self.hosted.count_unrun(self.plan.servers[label])
        index = len(self.output)
        self.output.append(item)
        await self._write(emit, items.unrun_call_events(index, item))
        return item

    async def _pass(
        self, batches: Batches, emit: Emit, *, opening: bool
    ) -> tuple[Event | None, list[dict[str, Any]], list[dict[str, Any]]]:
        """Write one pass's events (rewritten); its terminal event, its MCP calls, and the
        items it kept (as the next pass's input)."""
        hidden: set[int] = set()
        index_map: dict[int, int] = {}
        calls: list[dict[str, Any]] = []
        kept: list[dict[str, Any]] = []
        # The items made before the plan's (a compaction) stay first: the approved calls ran
        # after it, and a later request must not drop them as history before it.
        made = len(self.first.prepared.leading)
        # Not closed at its terminal event: the caller reads the pass's tail (`_finish_pass`).
        async for batch in batches:
            if not batch:  # time for a keepalive (`Exchange.batches`)
                await emit([])
                continue
            out: list[Event] = []
            for event in batch:
                kind = event["type"]
                if kind in OPENING_EVENTS:
                    if opening:
                        out.append(self._with_tools(event))
                    continue
                if kind in TERMINAL_EVENTS:
                    if opening and len(self.output) == made and self.plan.opening:
                        out += self._opening_events()
                    await self._write(emit, out)
                    for item in event["response"].get("output", []):
                        if self._is_mcp_call(item):
                            calls.append(item)
                        else:
                            kept.append(item)
                    return event, calls, kept
                index: int | None = event.get("output_index")
                if index is None:
                    out.append(event)
                    continue
                if kind == "response.output_item.added" and self._is_mcp_call(event["item"]):
                    hidden.add(index)
                if index in hidden:
                    continue
                if kind == "response.output_item.added":
                    if opening and len(self.output) == made and self.plan.opening:
                        out += self._opening_events()
                    index_map[index] = len(self.output)
                    self.output.append(event["item"])
                mapped = index_map.get(index, index)
                event = {**event, "output_index": mapped}
                if kind == "response.output_item.done":
                    self.output[mapped] = event["item"]
                out.append(event)
            if opening and any(e["type"] == "response.in_progress" for e in out):
                out += self._opening_events()
            await self._write(emit, out)
        return None, calls, kept

    async def _finish_pass(self) -> None:
        """Read the rest of the pass whose terminal event was seen: its exchange reads
        upstream's tail (`Frames.release`, bounded in time and frames), and the connection goes
        back to the pool for the next pass or request instead of being closed."""
        current, self._current = self._current, None
        if current is None:
            return
        async with contextlib.aclosing(current):
            async for _ in current:  # nothing follows a terminal event but the tail's reading
                pass

    def _opening_events(self) -> list[Event]:
        """The items made before the first pass (listings, approved calls), once."""
        events: list[Event] = []
        for item in self.plan.opening:
            index = len(self.output)
            self.output.append(item)
            if item["type"] == "mcp_list_tools":
                events += items.list_tools_events(index, item)
            elif item["status"] == "incomplete":  # approved, and the budget left it unrun
                events += items.unrun_call_events(index, item)
            else:
                events += items.call_start_events(index, item)
                events += items.call_end_events(index, item)
        self.plan.opening = []
        return events

    def _is_mcp_call(self, item: dict[str, Any]) -> bool:
        return item.get("type") == "function_call" and item.get("namespace") in self.plan.servers

    async def _run_call(self, emit: Emit, call: dict[str, Any]) -> dict[str, Any] | None:
        """Run (or ask approval for) the model's call; the finished `mcp_call`, or None when
        the response ends with an approval request."""
        label, name, arguments = call["namespace"], call["name"], call.get("arguments") or ""
        server = self.plan.servers[label]
        tool = declare.find_tool(self.plan.listed.get(label, []), name)
        index = len(self.output)
        if tool is not None and server.allows(tool) and server.needs_approval(tool):
            request = items.approval_request_item(self.hosted.ids("mcpr"), label, name, arguments)
            self.output.append(request)
            await self._write(emit, items.approval_request_events(index, request))
            return None
        self.calls += 1
        pending = items.call_item(self.hosted.ids("mcp"), label, name, arguments)
        self.output.append(pending)
        await self._write(emit, items.call_start_events(index, pending))
        if tool is None or not server.allows(tool):
            error = items.call_error(
                items.PROTOCOL_ERROR, f"the MCP server {label!r} has no allowed tool {name!r}"
            )
            done = {**pending, "status": "failed", "error": error}
        else:
            task = asyncio.ensure_future(self.hosted.call(server, name, arguments))
            try:
                while True:
                    done_set, _ = await asyncio.wait({task}, timeout=self.keepalive)
                    if done_set:
                        break
                    await emit([])
            finally:
                task.cancel()
            done = {**task.result(), "id": pending["id"]}
        self.output[index] = done
        await self._write(emit, items.call_end_events(index, done))
        return done

    async def _end(
        self, emit: Emit, terminal: Event, failure: tuple[str, str] | None = None
    ) -> None:
        response = {**terminal["response"], **_kept_from(self.head)}
        response["output"] = list(self.output)
        if self.usage is not None:
            response["usage"] = self.usage
        if failure is not None:
            code, message = failure
            response["status"] = "failed"
            response["error"] = {"code": "server_error", "message": message}
            await self._write(emit, [error_event(code, message)])
            terminal = {**terminal, "type": "response.failed"}
        self.snapshot = response
        await self._write(emit, [{**terminal, "response": response}])
        await self._finish_pass()  # once the client has its terminal event, as `Exchange` does

    def cancelled(self) -> list[Event]:
        """The events that end a stored copy of a response whose client went away mid-loop."""
        base = self.last["response"] if self.last is not None else self.head
        if base is None:
            return []
        # An item cut while it ran (an MCP call in flight) ends incomplete, as the core's do.
        output = [
            {**item, "status": "incomplete"} if item.get("status") == "in_progress" else item
            for item in self.output
        ]
        response = {**base, **_kept_from(self.head), "output": output, "status": "cancelled"}
        event: Event = {"type": "response.failed", "response": response}
        event["sequence_number"] = self.sequence
        self.sequence += 1
        return [event]

    def _with_tools(self, event: Event) -> Event:
        response = dict(event["response"])
        if self.tools_echo is None:
            self.tools_echo = self.plan.tools_echo(list(response.get("tools") or []))
        response["tools"] = self.tools_echo
        if self.plan.tool_choice is not None:
            response["tool_choice"] = self.plan.tool_choice
        if self.head is None:
            self.head = response
        return {**event, "response": response}

    def _add_usage(self, usage: dict[str, Any] | None) -> None:
        if usage is None:
            return
        self.usage = usage if self.usage is None else _summed(self.usage, usage)

    async def _write(self, emit: Emit, events: list[Event]) -> None:
        if not events:
            return
        for event in events:
            event["sequence_number"] = self.sequence
            self.sequence += 1
        await emit(events)


#: What the final response keeps of the first pass's: its identity, the request's echo as the
#: stored chain saw it, and the tools as declared.
_HEAD_KEYS = (
    "id",
    "created_at",
    "previous_response_id",
    "background",
    "conversation",
    "tools",
    "tool_choice",
)


async def _settled(exchange: Exchange) -> Batches:
    """The events of a response settled without generating: started and completed at once,
    no output of the model's."""
    exchange.phase = "streaming"
    yield exchange.core.start() + exchange.core.finish("stop", output_tokens=0)


def _kept_from(head: dict[str, Any] | None) -> dict[str, Any]:
    return {key: head[key] for key in _HEAD_KEYS if head is not None and key in head}


def _summed(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in a.keys() | b.keys():
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            out[key] = _summed(x, y)
        elif isinstance(x, int) and isinstance(y, int):
            out[key] = x + y
        else:
            out[key] = y if y is not None else x
    return out
