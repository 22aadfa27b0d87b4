"""The summarisation pass of a compaction, run through upstream and the repair core like any
response (with its reasoning), answered as data instead of to a client.

The pass is an `Exchange` over a prepared `/v1/responses` body (request/compaction.py's
`pass_body`: the history, then the summarisation instruction, no tools, not stored) whose JSON
answer is kept here. Anything but a completed response with a summary — upstream unreachable,
cut, timed out, a tool call, an empty answer — is one 502 `compaction_failed`: the client's
history is untouched and it can retry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.errors import ProxyError, UpstreamError
from proxy.harmony.mcp.carry import MCP_TYPES, carry, pending_answers
from proxy.harmony.request import compaction
from proxy.harmony.request.inputs import as_items
from proxy.harmony.request.prepare import PreparedRequest
from proxy.server import asgi
from proxy.server.deps import RepairDeps, check_stream_room
from proxy.server.exchange import Exchange

COMPACTION_FAILED = "compaction_failed"


@dataclass(frozen=True, slots=True)
class Pass:
    """A finished pass: the summary and the pass's `usage`."""

    summary: str
    usage: dict[str, Any]


async def summarise(
    deps: RepairDeps,
    prepared: PreparedRequest,
    request_id: str,
    started: float,
    headers: asgi.RawHeaders,
) -> Pass:
    """Run the pass (module doc); `UpstreamError` 502 `compaction_failed` when it fails."""
    state = deps.state
    capability = state.capability
    if not capability.token_ids:
        raise _failed(f"upstream cannot serve the pass: {capability.detail}")
    check_stream_room(deps)  # the pass is a stream upstream like any other
    exchange = Exchange(
        deps,
        prepared,
        request_id,
        started,
        headers,
        guided=capability.guided,
        takes_response_format=capability.takes_response_format,
    )
    answer = _Kept()
    state.in_flight += 1
    deps.metrics.in_flight.inc()
    try:
        await exchange.answer(answer)
    except ProxyError as error:
        raise _failed(f"the summarisation pass failed: {error.message}") from None
    finally:
        state.in_flight -= 1
        deps.metrics.in_flight.dec()
    response = answer.json()
    summary = compaction.summary_of(response)
    if summary is None:
        raise _failed("the summarisation pass did not complete with a summary")
    return Pass(summary, response.get("usage") or {})


Render = Callable[[dict[str, Any]], Awaitable[PreparedRequest]]


def compacting(
    deps: RepairDeps,
    body: dict[str, Any],
    render: Render,
    request_id: str,
    started: float,
    headers: asgi.RawHeaders,
    inbound: asgi.Disconnects | None = None,
) -> tuple[dict[str, Any], Render]:
    """`body` without a last `compaction_trigger` item (never stored: it is a request, not
    history), and `render`, compacting first where the body asks for it: that trigger, or a
    prompt past `context_management`'s `compact_threshold` — unless the window already starts
    with a compaction and what came after it is within the threshold (`_over`). Then the
    summarisation pass runs (`summarise`) over the merged history, and the body renders as its
    compaction item (everything before it is dropped, as for any compaction item; the kept user
    messages are inside it), with the item as the response's first output item. `input_tokens`
    is thus the compacted prompt's. A client that goes away during the pass (`inbound`)
    cancels it, and its upstream request: `asgi.ClientDisconnected`.

    `render` may plan hosted MCP tools, and planning runs the calls an `mcp_approval_response`
    approves: it runs once, on the body that is answered. The prompt is measured without those
    answers (a plan that lists, and runs nothing), the pass renders with the plain renderer
    (`plain_items`), and the answered body is the compaction item followed by the approvals
    still to run (`pending_mcp`), so the call runs after the compaction, exactly once."""
    item_trigger = compaction.triggered(body)
    if item_trigger:
        body = {**body, "input": body["input"][:-1]}
    plain: Render = deps.renderer.prepare
    if deps.tracing is not None:
        plain = deps.tracing.traced("render", plain)

    async def render_compacting(body: dict[str, Any]) -> PreparedRequest:
        threshold = compaction.read_context_management(body.get("context_management"))
        if not item_trigger and threshold is None:
            return await render(body)
        quiet = _without_answers(body)
        measured = await render(quiet)  # validates every field; runs no MCP call
        if not item_trigger and not await _over(render, quiet, measured, threshold):
            return measured if quiet is body else await render(body)
        trigger = "item" if item_trigger else "threshold"
        history = as_items(body.get("input"))
        try:
            pass_prepared = await plain(plain_items(compaction.pass_body(body)))
            done = await watched(
                inbound, summarise(deps, pass_prepared, request_id, started, headers)
            )
        except UpstreamError:
            deps.metrics.compactions.labels(trigger, "failed").inc()
            raise
        budget = compaction.kept_budget(threshold, deps.settings.max_prompt_tokens)
        kept = compaction.kept(history, deps.reasoning_keys, budget)
        blob = compaction.seal(deps.reasoning_keys, done.summary, kept)
        item = compaction.compaction_item(deps.ids("cmp"), blob)
        compacted = await render({**body, "input": [item, *pending_mcp(history)]})
        deps.metrics.compactions.labels(trigger, "ok").inc()
        deps.log(
            "compaction",
            request_id=request_id,
            trigger=trigger,
            prompt_tokens=len(measured.prompt_token_ids),
            compacted_tokens=len(compacted.prompt_token_ids),
            kept_items=len(kept),
            pass_input_tokens=done.usage.get("input_tokens"),
            pass_output_tokens=done.usage.get("output_tokens"),
        )
        return dataclasses.replace(compacted, leading=(item,))

    return body, render_compacting


async def _over(
    render: Render, body: dict[str, Any], measured: PreparedRequest, threshold: int | None
) -> bool:
    """Whether `body` (rendered as `measured`) is past `threshold`: its prompt is, and its
    window does not start with a compaction whose later items are within it. A window that
    starts with one is compacted again only once its new items alone pass the threshold:
    otherwise what the compaction keeps (its summary and kept user messages, the tools and
    instructions) could keep the prompt over it and every request would pay a pass."""
    if threshold is None or len(measured.prompt_token_ids) <= threshold:
        return False
    items = body.get("input")
    if not isinstance(items, list) or compaction.latest(items) < 0:
        return True
    start = compaction.latest(items)
    base = await render({**body, "input": items[: start + 1]})
    return len(measured.prompt_token_ids) - len(base.prompt_token_ids) > threshold


def _without_answers(body: dict[str, Any]) -> dict[str, Any]:
    """`body` without its `mcp_approval_response` items (itself when it has none): planning it
    lists the MCP tools and runs no call."""
    items = body.get("input")
    if not isinstance(items, list) or not any(_is(item, ANSWER) for item in items):
        return body
    return {**body, "input": [item for item in items if not _is(item, ANSWER)]}


def plain_items(body: dict[str, Any]) -> dict[str, Any]:
    """A summarisation pass's body with its `mcp_*` items as the plain renderer reads them
    (carry.py): an `mcp_call` as the call and its output; listings and approvals, which are no
    part of the conversation's text, left out. A malformed one is a 400, before the pass."""
    items = body.get("input")
    if not isinstance(items, list) or not any(
        isinstance(item, dict) and item.get("type") in MCP_TYPES for item in items
    ):
        return body
    return {**body, "input": carry(items).items}


def pending_mcp(items: list[Any]) -> list[Any]:
    """The `mcp_*` items a compacted body keeps after its compaction item, in order: the tool
    listings (reused, not listed again) and each approval still to run with its answer. A call
    already run (an `mcp_call` naming the approval) is history, in the summary: its approval is
    not kept, or it would run again."""
    pending = {request["id"] for request, _ in pending_answers(carry(items))}
    return [
        item
        for item in items
        if _is(item, "mcp_list_tools")
        or (_is(item, "mcp_approval_request") and item.get("id") in pending)
        or (_is(item, ANSWER) and item.get("approval_request_id") in pending)
    ]


ANSWER = "mcp_approval_response"


def _is(item: Any, kind: str) -> bool:
    return isinstance(item, dict) and item.get("type") == kind


async def watched(inbound: asgi.Disconnects | None, work: Awaitable[Pass]) -> Pass:
    """`work`, cancelled when the client goes away first (`asgi.ClientDisconnected`)."""
    if inbound is None:
        return await work
    kept: list[Pass] = []

    async def run() -> None:
        kept.append(await work)

    if await asgi.run_until_disconnect(inbound, run()):
        raise asgi.ClientDisconnected("the client went away during the compaction")
    return kept[0]


def _failed(message: str) -> UpstreamError:
    return UpstreamError(message, status=502, code=COMPACTION_FAILED)


class _Kept:
    """An ASGI `send` that keeps the JSON answer's body."""

    def __init__(self) -> None:
        self.body = bytearray()

    async def __call__(self, message: Any) -> None:
        if message["type"] == "http.response.body":
            self.body += message.get("body", b"")

    def json(self) -> dict[str, Any]:
        loaded = orjson.loads(bytes(self.body)) if self.body else {}
        return loaded if isinstance(loaded, dict) else {}
