"""Upstream `/v1/completions` stream frames (`detokenize: false`), parsed without I/O.

Each `data:` payload is one of: a chunk whose `choices[0].token_ids` holds every token since the
previous frame (possibly none) and, on the last content frame, `finish_reason`/`stop_reason`; a
usage frame (`choices: []`, `usage`); `{"error": …}` (newer servers, mid-stream); or `[DONE]`.
Anything else is a protocol error the shell turns into `response.failed`.

Asked for logprobs (`logprobs: N`, builds from early 2026), a chunk's `logprobs` holds
`token_logprobs` (one number per id of `token_ids`, in order) and `top_logprobs` (one
`{decoded string: logprob}` per id); `tokens` (decoded strings) is not read: the proxy names
tokens from the vocabulary by id. A `top_logprobs` dict is not in order of likelihood: upstream
lists the sampled token first, then its top N (N + 1 keys when the sampled token is not among
them), and ids that decode to the same string share one key. It is read as it comes, any order
and any number of keys; the core picks and sorts the best (`proxy.harmony.stream.logprobs.best`).
Missing or misaligned logprobs are a `FrameError` (`malformed_logprobs`): the stream fails
rather than carry wrong values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import orjson

DONE = "[DONE]"
_MAX_TOKEN_ID = 2**32 - 1


class FrameError(ValueError):
    """A frame the proxy cannot use; `code` names the kind (a metric label, never free text)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class Frame:
    """One parsed upstream frame (`done` is the `[DONE]` sentinel)."""

    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    completion_tokens: int | None = None
    done: bool = False
    #: Upstream's logprob of each id and its alternatives (only when asked for).
    logprobs: tuple[float, ...] | None = None
    top_logprobs: tuple[dict[str, float] | None, ...] | None = None


DONE_FRAME = Frame(done=True)


def parse_frame(data: str, *, logprobs: bool = False) -> Frame:
    """Parse one `data:` payload; raise `FrameError` for errors and malformed frames.
    `logprobs`: the request asked for them, so a chunk with ids must carry them."""
    if data == DONE:
        return DONE_FRAME
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise FrameError(
            "malformed_frame", f"upstream sent a frame that is not JSON: {exc}"
        ) from exc
    if not isinstance(payload, dict):
        raise FrameError("malformed_frame", "upstream sent a frame that is not a JSON object")
    if "error" in payload:
        raise FrameError("upstream_error", f"upstream reported an error: {_error_text(payload)}")
    choices = payload.get("choices")
    if not isinstance(choices, list):
        raise FrameError("malformed_frame", "upstream frame has no 'choices' list")
    usage = payload.get("usage")
    completion_tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if not isinstance(completion_tokens, int):
        completion_tokens = None
    if not choices:
        return Frame(completion_tokens=completion_tokens)
    choice = choices[0]
    if not isinstance(choice, dict):
        raise FrameError("malformed_frame", "upstream frame's choice is not an object")
    token_ids = choice.get("token_ids")
    if not isinstance(token_ids, list):
        # Without token ids there is nothing to repair: the server ignored `detokenize: false`.
        raise FrameError("missing_token_ids", "upstream frame carries no 'token_ids'")
    for token in token_ids:
        if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token <= _MAX_TOKEN_ID:
            raise FrameError("malformed_frame", f"upstream sent an invalid token id {token!r}")
    finish_reason = choice.get("finish_reason")
    if finish_reason is not None and not isinstance(finish_reason, str):
        raise FrameError("malformed_frame", f"invalid finish_reason {finish_reason!r}")
    stop_reason = choice.get("stop_reason")
    if not isinstance(stop_reason, int | str) or isinstance(stop_reason, bool):
        stop_reason = None
    if logprobs and token_ids:
        values, top = read_logprobs(choice.get("logprobs"), len(token_ids))
        return Frame(
            tuple(token_ids), finish_reason, stop_reason, completion_tokens, False, values, top
        )
    return Frame(tuple(token_ids), finish_reason, stop_reason, completion_tokens)


def read_logprobs(
    raw: Any, count: int
) -> tuple[tuple[float, ...], tuple[dict[str, float] | None, ...] | None]:
    """A chunk's `logprobs` for its `count` ids (module doc), or `FrameError`; the probe
    reads a non-streamed answer's with it too."""
    if not isinstance(raw, dict):
        raise _bad_logprobs(f"a frame of {count} token ids came without logprobs")
    values = raw.get("token_logprobs")
    if not isinstance(values, list) or len(values) != count:
        raise _bad_logprobs(f"token_logprobs do not align with the frame's {count} token ids")
    for value in values:
        if not _logprob(value):
            raise _bad_logprobs(f"invalid token logprob {str(value)[:40]!r}")
    top = raw.get("top_logprobs")
    if top is None:
        return tuple(values), None
    if not isinstance(top, list) or len(top) != count:
        raise _bad_logprobs(f"top_logprobs do not align with the frame's {count} token ids")
    for alternatives in top:
        if alternatives is not None and not (
            isinstance(alternatives, dict)
            and all(_logprob(value) for value in alternatives.values())
        ):
            raise _bad_logprobs(f"invalid top_logprobs entry {str(alternatives)[:60]!r}")
    return tuple(values), tuple(top)


def _logprob(value: Any) -> bool:
    """A log probability as JSON carries one: a finite number (no sign check: rounding in
    upstream's half-precision softmax may give a hair above 0 for a certain token)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _bad_logprobs(message: str) -> FrameError:
    return FrameError("malformed_logprobs", f"upstream sent malformed logprobs: {message}")


def _error_text(payload: dict[str, Any]) -> str:
    error = payload["error"]
    if isinstance(error, dict):
        return str(error.get("message") or error)[:500]
    return str(error)[:500]


def error_message(body: bytes) -> str | None:
    """The message of an upstream error body (`{"object": "error", "message": …}` or OpenAI's
    `{"error": {"message": …}}`), or None when the body is not JSON or carries no message."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(payload, dict):
        if isinstance(payload.get("message"), str):
            return str(payload["message"])[:1000]
        error = payload.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:1000]
        if isinstance(error, str):
            return error[:1000]
    return None


def describe_error_body(body: bytes, content_type: str, cut: str | None = None) -> str:
    """What an error body without a usable message was — never the body itself, which may be
    junk or a fragment (quoted, a lone `{` made a useless 400 message). `cut` says why it is
    incomplete (it is read under a deadline and a size cap)."""
    if cut is not None:
        return f"an error body that was {cut} (not quoted)"
    if not body:
        return "an empty body"
    what = content_type.split(";", 1)[0].strip()[:100] or "no content type"
    try:
        orjson.loads(body)
    except orjson.JSONDecodeError:
        return f"an error body that is not JSON ({len(body)} bytes of {what}; not quoted)"
    return f"a JSON error body without a message ({len(body)} bytes; not quoted)"
