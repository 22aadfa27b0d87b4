"""The Responses `response` object: the per-response inputs and the snapshot built from them.

Both the repaired stream (`stream.py`) and the model of the unpatched upstream (`unpatched.py`)
carry this object in `response.created`, `response.in_progress` and the terminal event, so it
lives here once. Its keys and defaults mirror trtllm-serve's `ResponsesResponse` (openai 3.57.0
model) as recorded in `tests/fixtures/trtllm-oracle/`, so a client sees the fields it would have
seen from upstream.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

#: prefix ("resp", "rs", "msg", "fc", "call", …) → a new id with that prefix.
IdFactory = Callable[[str], str]


def random_id(prefix: str) -> str:
    """The production id factory: `<prefix>_<32 hex>`, the shape of upstream's `random_uuid()`
    ids, with all 128 bits random (a uuid4 has 122): stored responses are found by id alone,
    so an id must not be guessable (issue 13)."""
    return f"{prefix}_{secrets.token_hex(16)}"


class CountingIds:
    """A deterministic id factory for tests: `<prefix>_<n as 32 hex digits>`, n = start, start+1…

    Upstream's fixtures were recorded with uuid4 replaced by a counter, which gives exactly these
    ids (`resp_000…001`, `rs_000…003`, …).
    """

    def __init__(self, start: int = 1) -> None:
        self._counter: Iterator[int] = itertools.count(start)

    def __call__(self, prefix: str) -> str:
        return f"{prefix}_{next(self._counter):032x}"


#: Request-echo fields of upstream's response object and their values when the request omits
#: them. The request side (`request.py`) produces the overrides in `ResponseContext.echo`.
DEFAULT_ECHO: Mapping[str, Any] = {
    "instructions": None,
    "metadata": None,
    "parallel_tool_calls": False,
    "temperature": 1.0,
    "tool_choice": "auto",
    "tools": [],
    "top_p": 1.0,
    "background": False,
    "conversation": None,
    "max_output_tokens": None,
    "max_tool_calls": None,
    "previous_response_id": None,
    "prompt": None,
    "prompt_cache_key": None,
    "prompt_cache_retention": None,
    "reasoning": None,
    "safety_identifier": None,
    "service_tier": "auto",
    "text": None,
    "top_logprobs": 0,
    "truncation": "disabled",
    "user": None,
}

#: Upstream's key order (the openai 3.57.0 `Response` model): echo keys slot in by name.
# fmt: off
_KEY_ORDER = (
    "id", "access_programs", "created_at", "error", "incomplete_details", "instructions",
    "metadata", "model", "object", "output", "parallel_tool_calls", "temperature", "tool_choice",
    "tools", "top_p", "background", "completed_at", "conversation", "image",
    "input_transformations", "max_output_tokens", "max_tool_calls", "moderation",
    "previous_response_id", "prompt", "prompt_cache_diagnostics", "prompt_cache_key",
    "prompt_cache_options", "prompt_cache_retention", "reasoning", "safety_identifier",
    "service_tier", "status", "text", "tool_usage", "top_logprobs", "truncation", "usage", "user",
)
# fmt: on


@dataclass(frozen=True, slots=True)
class ResponseContext:
    """Everything about one response that does not come from the generated tokens.

    `echo` holds request-echo fields in wire names (`DEFAULT_ECHO` fills the rest);
    `namespaces` are the `namespace` tools the request declared, so a recipient `NS.fn` becomes a
    function call `fn` in namespace `NS`; `coalesce_deltas` merges the deltas of one item within
    one `feed` call into one event (False: one delta event per token).
    """

    response_id: str
    created_at: float
    model: str
    echo: Mapping[str, Any] = field(default_factory=dict)
    input_tokens: int = 0
    namespaces: frozenset[str] = frozenset()
    coalesce_deltas: bool = True


def response_object(
    ctx: ResponseContext,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    error: dict[str, Any] | None = None,
    incomplete_details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `response` object in upstream's key order, with the request echo applied."""
    values: dict[str, Any] = {**DEFAULT_ECHO, **ctx.echo}
    values.update(
        id=ctx.response_id,
        created_at=ctx.created_at,
        model=ctx.model,
        object="response",
        output=output,
        status=status,
        usage=usage,
        error=error,
        incomplete_details=incomplete_details,
    )
    ordered = {key: values.pop(key, None) for key in _KEY_ORDER}
    ordered.update(values)  # echo fields newer than upstream's model go last
    return ordered
