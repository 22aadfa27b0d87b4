"""`POST /v1/completions`, as trtllm-serve's `openai_completion` answers it.

Validation errors answer 400 `{"error": …}`, handler errors 400 in `ErrorResponse` shape, both
before anything is generated. Streaming, the status line and headers go out at once
(`StreamingResponse` starts before the generator yields), then one frame per engine output as it
becomes available, the usage frame, `[DONE]`. Non-streaming, the whole body once generation ends.
"""

from __future__ import annotations

import orjson

from proxy.simulator.completion_frames import DONE, MALFORMED, CompletionWriter
from proxy.simulator.completion_request import (
    CompletionParams,
    HandlerError,
    read_completion_request,
)
from proxy.simulator.engine import EngineOutput, Sampling
from proxy.simulator.faults import stream_faults
from proxy.simulator.generation import run_generation, stop_kept
from proxy.simulator.guided import GuidedError
from proxy.simulator.options import Options
from proxy.simulator.shell import SSE_CONTENT_TYPE, Exchange, FaultPlan, answer_body, stream_outputs
from proxy.simulator.validation import RequestValidationError, error_body, json_error


async def serve_completions(exchange: Exchange, options: Options, raw: bytes) -> None:
    state = exchange.state
    try:
        params = read_completion_request(orjson.loads(raw))
    except orjson.JSONDecodeError as exc:
        await exchange.json(400, json_error(str(exc)).body())
        return
    except RequestValidationError as exc:
        await exchange.json(400, exc.body())
        return
    except HandlerError as exc:
        await exchange.json(400, error_body(str(exc), 400))
        return
    if isinstance(params.prompt, str):
        # The HF tokenizer turns special-token text into special tokens.
        prompt_ids = state.encoding.encode(params.prompt, allowed_special="all")
    else:
        prompt_ids = params.prompt
    limit = state.config.max_seq_len
    if len(prompt_ids) + (params.max_tokens or 0) > limit:
        message = (
            f"The sum of prompt length ({len(prompt_ids)}) and max_tokens "
            f"({params.max_tokens or 0}) should not exceed max_seq_len ({limit})"
        )
        await exchange.json(400, error_body(message, 400))
        return
    record = exchange.record
    record.stream, record.prompt_ids = params.stream, tuple(prompt_ids)
    sampling = Sampling(
        max_tokens=params.max_tokens,
        stop_token_ids=params.stop_token_ids,
        include_stop_str_in_output=stop_kept(options, params.include_stop_str_in_output),
        ignore_eos=params.ignore_eos,
    )
    plan = FaultPlan(stream_faults(options.faults, data_frames=True))
    try:
        _, outputs = run_generation(
            state, prompt_ids, options, sampling, split=plan.positions, constraint=params.constraint
        )
    except GuidedError as exc:
        await exchange.json(400, error_body(str(exc), 400))
        return
    writer = CompletionWriter(
        state.encoding,
        params,
        engine_id=record.number,
        created=int(state.clock()),
        prompt_tokens=len(prompt_ids),
        prompt_text=params.prompt if isinstance(params.prompt, str) else None,
        logprobs=state.config.completion_logprobs,
    )
    if params.stream:
        await exchange.run(_stream(exchange, params, outputs, writer, plan))
    else:
        await exchange.run(_answer(exchange, outputs, writer, plan))


async def _stream(
    exchange: Exchange,
    params: CompletionParams,
    outputs: list[EngineOutput],
    writer: CompletionWriter,
    plan: FaultPlan,
) -> None:
    record = exchange.record

    async def send(output: EngineOutput, outcome: str) -> bool:
        frame = writer.chunk(
            output, without_token_ids=outcome == "strip", bad_logprobs=outcome == "bad-logprobs"
        )
        record.finish_reason, record.stop_reason = output.finish_reason, output.stop_reason
        await exchange.write(frame)
        return True

    await exchange.start(200, [SSE_CONTENT_TYPE])
    outcome = await stream_outputs(exchange, outputs, plan, send, malformed=MALFORMED)
    if outcome == "ended":
        return
    if outcome == "strip":  # due after the last frame: one more, empty, without token_ids
        await exchange.write(writer.chunk(EngineOutput(()), without_token_ids=True))
    if params.include_usage:
        await exchange.write(writer.usage_frame())
    await exchange.finish(DONE)


async def _answer(
    exchange: Exchange, outputs: list[EngineOutput], writer: CompletionWriter, plan: FaultPlan
) -> None:
    state, record = exchange.state, exchange.record
    await exchange.pace(sum(output.delay for output in outputs))
    body = orjson.dumps(writer.response(outputs, state.ids("cmpl").replace("_", "-", 1)))
    record.finish_reason, record.stop_reason = outputs[-1].finish_reason, outputs[-1].stop_reason
    for output in outputs:
        record.deliver(output.token_ids)
    await answer_body(exchange, body, plan.due(2**63))
