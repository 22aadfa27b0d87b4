"""The Responses `response` object: the per-response inputs and the snapshot built from them.

Both the repaired stream (`stream/repair.py`) and the model of the unpatched upstream
(`unpatched/emitter.py`) carry this object in `response.created`, `response.in_progress` and the
terminal event, so it lives here once. Its keys and defaults mirror trtllm-serve's
`ResponsesResponse` (openai 3.57.0 model) as recorded in `tests/fixtures/trtllm-oracle/`, so a
client sees the fields it would have seen from upstream.
"""

from __future__ import annotations

import itertools
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.harmony.constraint import OutputConstraint

#: prefix ("resp", "rs", "msg", "fc", "call", …) → a new id with that prefix.
IdFactory = Callable[[str], str]
#: A reasoning item's text parts → its `encrypted_content` (reasoning_seal.py).
Sealer = Callable[[Sequence[str]], str]


def random_id(prefix: str) -> str:
    """The production id factory: `<prefix>_<32 hex>`, the shape of upstream's `random_uuid()`
    ids, with all 128 bits random (a uuid4 has 122): stored responses are found by id alone,
    so an id must not be guessable."""
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


#: Request-echo fields of the response object and their values when the request omits them. The
#: request side (request/prepare.py) produces the overrides in `ResponseContext.echo`. Upstream's
#: defaults, except where OpenAI's spec says otherwise: `parallel_tool_calls` defaults
#: to true, `text` to the plain-text format, `store` is echoed, and `user` is left out when unset
#: (the spec's type has no null).
DEFAULT_ECHO: Mapping[str, Any] = {
    "instructions": None,
    "metadata": None,
    "parallel_tool_calls": True,
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
    "store": True,
    "text": {"format": {"type": "text"}},
    "top_logprobs": 0,
    "truncation": "disabled",
}

#: The one tier this server has. The spec: "the response body will include the `service_tier`
#: value based on the processing mode actually used to serve the request".
SERVICE_TIER = "default"

#: Upstream's key order (the openai 3.57.0 `Response` model): echo keys slot in by name; `store`
#: (not in that model) where OpenAI's own responses put it.
# fmt: off
_KEY_ORDER = (
    "id", "access_programs", "created_at", "error", "incomplete_details", "instructions",
    "metadata", "model", "object", "output", "parallel_tool_calls", "temperature", "tool_choice",
    "tools", "top_p", "background", "completed_at", "conversation", "image",
    "input_transformations", "max_output_tokens", "max_tool_calls", "moderation",
    "previous_response_id", "prompt", "prompt_cache_diagnostics", "prompt_cache_key",
    "prompt_cache_options", "prompt_cache_retention", "reasoning", "safety_identifier",
    "service_tier", "status", "store", "text", "tool_usage", "top_logprobs", "truncation",
    "usage", "user",
)
# fmt: on
#: Keys whose type in OpenAI's spec has no null: left out while they have no value.
_NOT_NULLABLE = ("prompt_cache_options", "usage", "user")


@dataclass(frozen=True, slots=True)
class ResponseContext:
    """Everything about one response that does not come from the generated tokens.

    `echo` holds request-echo fields in wire names (`DEFAULT_ECHO` fills the rest);
    `namespaces` are the `namespace` tools the request declared, so a recipient `NS.fn` becomes a
    function call `fn` in namespace `NS`; `coalesce_deltas` merges the deltas of one item within
    one `feed` call into one event (False: one delta event per token); `clock` gives
    `completed_at` (the shell injects its wall clock; without one a response completes at its
    `created_at`, which keeps the core deterministic); `seal` gives reasoning items their
    `encrypted_content` when the request included it (None: null); `top_logprobs`: the
    request included `message.output_text.logprobs` and wants this many alternatives per token
    (None: no logprobs); `constraint`: what `tool_choice` and `text.format` demand of
    the output, checked as it is parsed (constraint.py; None: nothing); `leading`: items the
    output starts with, made before generation (a compaction), announced right after
    `response.in_progress`.
    """

    response_id: str
    created_at: float
    model: str
    echo: Mapping[str, Any] = field(default_factory=dict)
    input_tokens: int = 0
    namespaces: frozenset[str] = frozenset()
    coalesce_deltas: bool = True
    clock: Callable[[], float] | None = None
    seal: Sealer | None = None
    top_logprobs: int | None = None
    constraint: OutputConstraint | None = None
    leading: tuple[dict[str, Any], ...] = ()


def response_object(
    ctx: ResponseContext,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    error: dict[str, Any] | None = None,
    incomplete_details: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `response` object in upstream's key order, with the request echo applied.

    Valid against OpenAI's spec: `completed_at` is set exactly when `status` is
    `completed`, `service_tier` is the tier used, and keys whose type has no null are left out
    while unset.
    """
    values: dict[str, Any] = {**DEFAULT_ECHO, **ctx.echo}
    completed_at = None
    if status == "completed":
        completed_at = ctx.created_at if ctx.clock is None else float(int(ctx.clock()))
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
        completed_at=completed_at,
        service_tier=SERVICE_TIER,
    )
    ordered = {key: values.pop(key, None) for key in _KEY_ORDER}
    ordered.update(values)  # echo fields newer than upstream's model go last
    for key in _NOT_NULLABLE:
        if ordered[key] is None:
            del ordered[key]
    return ordered


def usage(input_tokens: int, output_tokens: int, reasoning_tokens: int) -> dict[str, Any]:
    """The `usage` of a finished response."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }
