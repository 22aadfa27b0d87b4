"""The `/v1/responses` answers of an unpatched trtllm-serve that are not the event stream.

The stream itself is `proxy.harmony.unpatched.emitter.UnpatchedStream`. Non-streaming, upstream
answers `ResponsesResponse.from_request(...)` dumped: the fields of trtllm's own model (not openai's
`Response`: 25 keys, no `error`, `incomplete_details`, `completed_at`, …), `created_at` an int,
`usage` null, `output` from the same builder as the streamed `response.completed`, `status` from
`finish_reason_mapping` (`tests/fixtures/trtllm-oracle/*/nonstream.json`). Sans-IO.
"""

from __future__ import annotations

from typing import Any, Final

from proxy.harmony.response import ResponseContext, response_object

#: The keys of upstream's non-streaming body, in its order.
NONSTREAM_KEYS: Final = (
    "id",
    "created_at",
    "instructions",
    "metadata",
    "model",
    "object",
    "output",
    "parallel_tool_calls",
    "temperature",
    "tool_choice",
    "tools",
    "top_p",
    "background",
    "max_output_tokens",
    "max_tool_calls",
    "previous_response_id",
    "prompt",
    "reasoning",
    "service_tier",
    "status",
    "text",
    "top_logprobs",
    "truncation",
    "usage",
    "user",
)

#: `finish_reason_mapping` for the finishes the simulated engine produces.
STATUS: Final = {"stop": "completed", "length": "incomplete"}


def nonstream_body(
    ctx: ResponseContext, output: list[dict[str, Any]], status: str
) -> dict[str, Any]:
    """Upstream's non-streaming Responses body."""
    full = response_object(ctx, status=status, output=output, usage=None)
    body = {key: full.get(key) for key in NONSTREAM_KEYS}
    body["created_at"] = int(ctx.created_at)
    return body


def not_found(response_id: str) -> tuple[int, str, str]:
    """`GET`/`DELETE /v1/responses/{id}`: nothing is stored (streamed responses never are, and
    the shipped configs' postprocess workers switch the store off)."""
    if not response_id.startswith("resp"):
        message = f"Invalid 'response_id': '{response_id}'. Expected an ID that begins with 'resp'."
        return 400, message, "InvalidRequestError"
    return 404, f"Response with id '{response_id}' not found.", "InvalidRequestError"
