"""`POST /v1/responses`, as an unpatched trtllm-serve answers it for gpt-oss.

The request is rendered by the proxy's own model of upstream's request path
(`proxy.harmony.request.prepare_request`: the same prompt ids, the same 4xx), generated with the
sampling upstream's Responses path uses (stop tokens `<|return|>` and `<|call|>`, `max_tokens` =
`max_output_tokens`, and — `SamplingParams`' default — `include_stop_str_in_output` false, so a
`<|call|>` is cut from the ids), and streamed exactly as upstream streams it, defect included,
through `proxy.harmony.unpatched.emitter.UnpatchedStream`: one body chunk per event, as Starlette's
`StreamingResponse` writes each string the generator yields. When upstream's stream would break
(its response builder raising), the simulator sends what upstream sent and drops the connection.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.errors import ClientError
from proxy.harmony import tokens
from proxy.harmony.request.prepare import PreparedRequest, prepare_request
from proxy.harmony.response import ResponseContext
from proxy.harmony.unpatched.emitter import UnpatchedStream
from proxy.harmony.unpatched.output import UpstreamOutputError, unpatched_output
from proxy.simulator.engine import EngineOutput, Sampling
from proxy.simulator.faults import stream_faults
from proxy.simulator.generation import run_generation, stop_kept
from proxy.simulator.options import Options
from proxy.simulator.records import SimulatorState
from proxy.simulator.responses import STATUS, nonstream_body
from proxy.simulator.shell import SSE_CONTENT_TYPE, Exchange, FaultPlan, answer_body, stream_outputs
from proxy.simulator.upstream_requests import (
    UpstreamRejection,
    as_upstream_renders,
    check_like_upstream,
    previous_response_rejection,
    upstream_echo,
)
from proxy.simulator.validation import error_body, error_type_for, json_error
from proxy.sse import encode

#: A Responses frame cut off mid-JSON (the `malformed` fault).
MALFORMED = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",\n\n'


async def serve_responses(exchange: Exchange, options: Options, raw: bytes) -> None:
    state = exchange.state
    try:
        prepared = _prepare(orjson.loads(raw), state)
    except orjson.JSONDecodeError as exc:
        await exchange.json(400, json_error(str(exc)).body())
        return
    except ClientError as exc:
        body = error_body(exc.message, exc.status, error_type_for(exc.status))
        await exchange.json(exc.status, body)
        return
    except UpstreamRejection as exc:
        await exchange.json(exc.status, error_body(exc.message, exc.status, exc.error_type))
        return
    prompt_ids = prepared.prompt_token_ids
    record = exchange.record
    record.stream, record.prompt_ids = prepared.stream, tuple(prompt_ids)
    sampling = Sampling(
        max_tokens=prepared.completion_body["max_tokens"],
        stop_token_ids=frozenset(tokens.ASSISTANT_ACTION_STOPS),
        include_stop_str_in_output=stop_kept(options, False),
    )
    plan = FaultPlan(stream_faults(options.faults, data_frames=False))
    _, outputs = run_generation(state, prompt_ids, options, sampling, split=plan.positions)
    ctx = ResponseContext(
        response_id=state.ids("resp"),
        created_at=float(int(state.clock())),
        model=state.config.model,
        echo=upstream_echo(prepared.echo),
        input_tokens=len(prompt_ids),
        namespaces=prepared.namespaces,
    )
    if prepared.stream:
        await exchange.run(_stream(exchange, ctx, outputs, plan))
    else:
        await exchange.run(_answer(exchange, ctx, outputs, plan))


def _prepare(body: Any, state: SimulatorState) -> PreparedRequest:
    """Validate and render as upstream does (upstream_requests.py); raises `ClientError` or
    `UpstreamRejection`."""
    previous = isinstance(body, dict) and body.get("previous_response_id") is not None
    try:
        prepared = prepare_request(
            {**body, "previous_response_id": None} if previous else body, state.encoding
        )
    except ClientError:
        check_like_upstream(body)  # where upstream rejects it too, in upstream's words
        raise
    rejection = previous_response_rejection(body, store=not state.config.postprocess_workers)
    if rejection is not None:
        raise rejection
    check_like_upstream(body)
    rendered = as_upstream_renders(body)
    return prepared if rendered is body else prepare_request(rendered, state.encoding)


async def _stream(
    exchange: Exchange, ctx: ResponseContext, outputs: list[EngineOutput], plan: FaultPlan
) -> None:
    state, record = exchange.state, exchange.record
    stream = UnpatchedStream(
        state.encoding, ctx, state.ids, postprocess_workers=state.config.postprocess_workers
    )

    async def send(output: EngineOutput, _outcome: str) -> bool:
        events = stream.feed(output.token_ids)
        if output.finish_reason is not None:
            events += stream.finish(output.finish_reason, output.stop_reason)
        if stream.aborted is not None:
            # Upstream's post-processor raised: what it had not yet sent is lost, and the
            # HTTP stream breaks without a terminal event.
            for event in events[: len(events) - stream.unsent_events]:
                await exchange.write(encode(event))
            record.faults.append("upstream-broken-stream")
            exchange.cut()
            return False
        for event in events:
            await exchange.write(encode(event))
        record.finish_reason, record.stop_reason = output.finish_reason, output.stop_reason
        return True

    await exchange.start(200, [SSE_CONTENT_TYPE])
    for event in stream.start():
        await exchange.write(encode(event))
    if await stream_outputs(exchange, outputs, plan, send, malformed=MALFORMED) == "ended":
        return
    await exchange.finish()


async def _answer(
    exchange: Exchange, ctx: ResponseContext, outputs: list[EngineOutput], plan: FaultPlan
) -> None:
    state, record = exchange.state, exchange.record
    await exchange.pace(sum(output.delay for output in outputs))
    token_ids = [token for output in outputs for token in output.token_ids]
    last = outputs[-1]
    record.finish_reason, record.stop_reason = last.finish_reason, last.stop_reason
    try:
        output = unpatched_output(state.encoding, token_ids, state.ids)
    except UpstreamOutputError as exc:
        await exchange.json(400, error_body(str(exc), 400))
        return
    status = STATUS.get(last.finish_reason or "", "completed")
    record.deliver(token_ids)
    body = orjson.dumps(nonstream_body(ctx, output, status))
    await answer_body(exchange, body, plan.due(2**63))
