"""`POST /v1/chat/completions`: a plain, correct Harmony chat (chat.py) on the simulated engine,
stopped at `<|return|>`/`<|call|>` (plus the request's `stop_token_ids`) like upstream's Harmony
chat path, with the stream framing of `/v1/completions` (`data:` frames, usage, `[DONE]`)."""

from __future__ import annotations

from typing import Any

import orjson

from proxy.harmony import tokens
from proxy.simulator.chat import ChatRequestError, ChatStream, render_chat
from proxy.simulator.completion_frames import DONE, MALFORMED, frame
from proxy.simulator.engine import EngineOutput, Sampling
from proxy.simulator.faults import stream_faults
from proxy.simulator.generation import run_generation, stop_kept
from proxy.simulator.options import Options
from proxy.simulator.shell import SSE_CONTENT_TYPE, Exchange, FaultPlan, answer_body, stream_outputs
from proxy.simulator.validation import error_body, json_error


async def serve_chat(exchange: Exchange, options: Options, raw: bytes) -> None:
    state = exchange.state
    try:
        body = orjson.loads(raw)
        if not isinstance(body, dict):
            raise ChatRequestError("the body must be a JSON object")
        prompt_ids = render_chat(body, state.encoding)
        max_tokens = _max_tokens(body)
        extra_stops = body.get("stop_token_ids") or []
        stops = frozenset(tokens.ASSISTANT_ACTION_STOPS) | frozenset(int(t) for t in extra_stops)
    except orjson.JSONDecodeError as exc:
        await exchange.json(400, json_error(str(exc)).body())
        return
    except (ChatRequestError, TypeError, ValueError) as exc:
        await exchange.json(400, error_body(str(exc), 400))
        return
    record = exchange.record
    stream = bool(body.get("stream"))
    record.stream, record.prompt_ids = stream, tuple(prompt_ids)
    sampling = Sampling(
        max_tokens=max_tokens,
        stop_token_ids=stops,
        include_stop_str_in_output=stop_kept(options, False),
    )
    plan = FaultPlan(stream_faults(options.faults, data_frames=True))
    _, outputs = run_generation(state, prompt_ids, options, sampling, split=plan.positions)
    chat = ChatStream(
        state.encoding,
        response_id=state.ids("chatcmpl").replace("_", "-", 1),
        created=int(state.clock()),
        model=str(body.get("model") or state.config.model),
    )
    usage = _usage(len(prompt_ids), outputs)
    options_field = body.get("stream_options")
    include_usage = isinstance(options_field, dict) and bool(options_field.get("include_usage"))
    if stream:
        await exchange.run(_stream(exchange, chat, outputs, plan, usage if include_usage else None))
    else:
        await exchange.run(_answer(exchange, chat, outputs, plan, usage))


def _max_tokens(body: dict[str, Any]) -> int | None:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ChatRequestError(f"max_tokens must be a positive integer, not {value!r}")
    return value


def _usage(prompt_tokens: int, outputs: list[EngineOutput]) -> dict[str, Any]:
    completion = sum(len(output.token_ids) for output in outputs)
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


async def _stream(
    exchange: Exchange,
    chat: ChatStream,
    outputs: list[EngineOutput],
    plan: FaultPlan,
    usage: dict[str, Any] | None,
) -> None:
    record = exchange.record

    async def send(output: EngineOutput, _outcome: str) -> bool:
        chunk = chat.feed(output.token_ids, output.finish_reason, output.stop_reason)
        record.finish_reason, record.stop_reason = output.finish_reason, output.stop_reason
        await exchange.write(frame(chunk))
        return True

    await exchange.start(200, [SSE_CONTENT_TYPE])
    await exchange.write(frame(chat.first()))
    if await stream_outputs(exchange, outputs, plan, send, malformed=MALFORMED) == "ended":
        return
    if usage is not None:
        await exchange.write(frame({**chat.first(), "choices": [], "usage": usage}))
    await exchange.finish(DONE)


async def _answer(
    exchange: Exchange,
    chat: ChatStream,
    outputs: list[EngineOutput],
    plan: FaultPlan,
    usage: dict[str, Any],
) -> None:
    record = exchange.record
    await exchange.pace(sum(output.delay for output in outputs))
    last = outputs[-1]
    for output in outputs:
        chat.feed(output.token_ids, None, None)
    finish = "tool_calls" if last.finish_reason == "stop" and chat.calls else last.finish_reason
    first = chat.first()
    body = {
        "id": first["id"],
        "object": "chat.completion",
        "created": first["created"],
        "model": first["model"],
        "choices": [
            {
                "index": 0,
                "message": chat.message(),
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": last.stop_reason,
            }
        ],
        "usage": usage,
    }
    record.finish_reason, record.stop_reason = last.finish_reason, last.stop_reason
    for output in outputs:
        record.deliver(output.token_ids)
    await answer_body(exchange, orjson.dumps(body), plan.due(2**63))
