"""The capability probe: what upstream's `/v1/completions` can do for the proxy, asked with a few
one-token requests on the lean client (off every request's path).

    1. `detokenize: false`, one token: are token ids returned? Without them nothing is repaired.
    2. the same with `logprobs: 1`: are token logprobs returned, aligned with the ids?
    3. the same with a `response_format` whose only valid output is a constant text gpt-oss
       never writes on its own (it always opens a header after `<|start|>assistant`): is
       `response_format` enforced? trtllm-serve enforces it only when it was started with a
       guided-decoding backend (`guided_decoding_backend: xgrammar` or `llguidance` in its
       extra LLM API options); without one it takes the field and ignores it, and only the
       generated tokens tell. An error answer means "not enforced" (a server that rejects
       the field enforces nothing); a failed request means "unknown".

Each step is a request of its own, so a build that refuses one field still serves the rest.
A request that fails below HTTP (`StreamError`) or takes longer than `PROBE_SECONDS` is "not
reachable" for the first steps and "unknown" for the later ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.upstream.completions import (
    FrameError,
    describe_error_body,
    error_message,
    read_logprobs,
)
from proxy.upstream.connection import RemoteProtocolError, StreamError
from proxy.upstream.stream import StreamClient

#: `<|start|>user<|message|>Hi<|end|><|start|>assistant`: the prompt of every probe.
PROBE_PROMPT = (200006, 1428, 200008, 13225, 200007, 200006, 173781)
#: What the guided probe constrains the output to: plain text where gpt-oss writes a header.
GUIDED_PROBE_TEXT = "zebra quartz"
GUIDED_PROBE_FORMAT = {
    "type": "structural_tag",
    "format": {"type": "const_string", "value": GUIDED_PROBE_TEXT},
}
#: Tokens the guided probe allows: one per character of the text at worst, and a stop token.
GUIDED_PROBE_TOKENS = 16
#: The probe's detail when upstream enforces `response_format`, and when it was not asked.
GUIDED = "response_format enforced (guided decoding)"
NOT_PROBED = "response_format enforcement not probed"
#: Token ids → their text, specials included (None: the ids do not decode).
Decode = Callable[[Sequence[int]], str | None]
#: Seconds each probe request may take, head and body (a one-token completion; prefill of the
#: probe's seven-token prompt waits behind the requests upstream is serving).
PROBE_SECONDS = 30.0
#: Seconds the model list may take (asked first, when no model is named).
MODELS_SECONDS = 10.0
#: Bytes of an answer read at most: a one-token completion is under 1 KB, a model list a few.
ANSWER_LIMIT = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Answer:
    """A whole, small upstream answer (`fetch`)."""

    status: int
    content_type: str
    content: bytes

    def json(self) -> Any:
        """The body as JSON; `ValueError` when it is not."""
        return orjson.loads(self.content)


async def fetch(
    client: StreamClient, method: str, path: str, body: Mapping[str, Any] | None = None
) -> Answer:
    """One small request on the lean client (`body` sent as JSON) and its whole answer;
    `StreamError` when the exchange fails or the answer is over `ANSWER_LIMIT` bytes. The
    caller times the call."""
    headers = [(b"accept", b"application/json"), (b"accept-encoding", b"identity")]
    content = b""
    if body is not None:
        headers.append((b"content-type", b"application/json"))
        content = orjson.dumps(body)
    response = await client.send(method, path, headers, content)
    try:
        received = b""
        while chunk := await response.read():
            received += chunk
            if len(received) > ANSWER_LIMIT:
                raise RemoteProtocolError(f"an answer over {ANSWER_LIMIT} bytes")
        return Answer(response.status, response.head.get("content-type"), received)
    finally:
        response.close()


async def _post(client: StreamClient, body: Mapping[str, Any]) -> Answer:
    async with asyncio.timeout(PROBE_SECONDS):
        return await fetch(client, "POST", "/v1/completions", body)


@dataclass(frozen=True, slots=True)
class Capability:
    """What the startup probe found: can upstream's /v1/completions return token ids, token
    logprobs with them (builds from early 2026), and does it enforce `response_format`
    (`guided`: None while unknown)?"""

    reachable: bool
    token_ids: bool
    detail: str
    model: str | None = None
    logprobs: bool = False
    guided: bool | None = None
    #: What the probe found about `response_format`, in words (also the end of `detail`).
    guided_detail: str = NOT_PROBED
    #: False when upstream answered the guided probe with an error (it refuses the field) or
    #: the operator said it does not enforce it: the field is then left out of its requests.
    takes_response_format: bool = True

    @property
    def guided_decoding(self) -> str:
        """`guided` in words, for /readyz and the log: enforced, not_enforced or unknown."""
        return {True: "enforced", False: "not_enforced", None: "unknown"}[self.guided]


async def probe(client: StreamClient, model: str | None, decode: Decode | None) -> Capability:
    """Probe upstream through `client` (module doc); without `decode` the guided step is left
    out (`guided` unknown)."""
    try:
        if model is None:
            async with asyncio.timeout(MODELS_SECONDS):
                models = await fetch(client, "GET", "/v1/models")
            data = models.json().get("data") or [{}]
            model = str(data[0].get("id") or "") or None
        body = {
            "model": model,
            "prompt": list(PROBE_PROMPT),
            "max_tokens": 1,
            "detokenize": False,
            "stream": False,
        }
        answer = await _post(client, body)
    except (StreamError, TimeoutError, ValueError, AttributeError, IndexError) as exc:
        return Capability(False, False, f"upstream not reachable: {type(exc).__name__}", model)
    if answer.status != 200:
        said = error_message(answer.content) or describe_error_body(
            answer.content, answer.content_type
        )
        detail = f"/v1/completions answered {answer.status}: {said}"
        return Capability(True, False, detail, model)
    try:
        choice = answer.json()["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return Capability(True, False, "/v1/completions answered no choices", model)
    if not isinstance(choice.get("token_ids"), list):
        detail = (
            "/v1/completions returned no token_ids for detokenize=false: this trtllm-serve "
            "is too old to repair; upgrade it, or set passthrough_when_incapable"
        )
        return Capability(True, False, detail, model)
    logprobs, said = await _logprobs(client, {**body, "logprobs": 1})
    guided, guided_said, takes = None, NOT_PROBED, True
    if decode is not None:
        guided, guided_said, takes = await _guided(client, body, decode)
    detail = f"token ids available; {said}; {guided_said}"
    return Capability(True, True, detail, model, logprobs, guided, guided_said, takes)


async def _logprobs(client: StreamClient, body: dict[str, Any]) -> tuple[bool, str]:
    """Whether upstream gives completions logprobs aligned with the token ids, and what the
    probe found in words (for /readyz and the start-up log)."""
    try:
        answer = await _post(client, body)
    except (StreamError, TimeoutError) as exc:
        return False, f"token logprobs unknown: the probe failed ({type(exc).__name__})"
    if answer.status != 200:
        said = error_message(answer.content) or f"HTTP {answer.status}"
        return False, f"no token logprobs (/v1/completions with logprobs: {said[:200]})"
    try:
        choice = answer.json()["choices"][0]
        read_logprobs(choice.get("logprobs"), len(choice["token_ids"]))
    except FrameError as exc:  # a ValueError too: first
        if choice.get("logprobs") is None:
            return False, "no token logprobs (this trtllm-serve's /v1/completions gives none)"
        return False, f"no usable token logprobs ({exc.message})"
    except (ValueError, KeyError, IndexError, TypeError):
        return False, "no token logprobs (this trtllm-serve's /v1/completions gives none)"
    return True, "token logprobs available"


async def _guided(
    client: StreamClient, body: dict[str, Any], decode: Decode
) -> tuple[bool | None, str, bool]:
    """Whether upstream enforces `response_format` (None: unknown), the finding in words, and
    whether it takes the field at all. The text is compared, not the ids: a masked engine may
    spell the constant with other tokens than the tokenizer's, and may go on after it once the
    grammar has ended."""
    request = {**body, "max_tokens": GUIDED_PROBE_TOKENS, "response_format": GUIDED_PROBE_FORMAT}
    try:
        answer = await _post(client, request)
    except (StreamError, TimeoutError) as exc:
        failed = type(exc).__name__
        return None, f"response_format enforcement unknown: the probe failed ({failed})", True
    if answer.status != 200:
        said = error_message(answer.content) or f"HTTP {answer.status}"
        return False, f"response_format not enforced (refused: {said[:200]})", False
    try:
        ids = answer.json()["choices"][0]["token_ids"]
        text = decode(ids) if isinstance(ids, list) else None
    except (ValueError, KeyError, IndexError, TypeError):
        text = None
    if text is not None and text.startswith(GUIDED_PROBE_TEXT):
        return True, GUIDED, True
    return (
        False,
        "response_format not enforced: upstream ignored a constraint to a constant text (no "
        "guided-decoding backend: start trtllm-serve with guided_decoding_backend: xgrammar)",
        True,
    )
