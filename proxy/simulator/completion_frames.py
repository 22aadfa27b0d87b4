"""The bytes of trtllm-serve's `/v1/completions` answers, streaming and not.

Streaming (`completion_stream_post_processor`, postprocess_handlers.py): one `data: {json}\\n\\n`
frame per engine output — `CompletionStreamResponse.model_dump_json()`, keys in model order,
`id` = `cmpl-<engine request id>` on every frame, `choices[0]` with `text` (the new text, or ""
with `detokenize: false`), `token_ids` (the output's new ids, `null` when detokenizing),
`finish_reason`/`stop_reason` on the last one; then with `stream_options.include_usage` a frame
with `choices: []` and `usage`; then `data: [DONE]` (`generator_wrapper` in openai_server.py).
Non-streaming: `CompletionResponse.model_dump()` as JSON.

Text comes from an incremental detokenizer that holds back the bytes of a character split
across tokens until it is complete (what HF's `decode_incrementally` does), and leaves out
special tokens when `skip_special_tokens`.

`logprobs: k` (builds from early 2026) gives, per chunk, `tokens` (each
id decoded on its own: U+FFFD for part of a character), `token_logprobs` and `top_logprobs` —
one `{decoded string: logprob}` dict per id — plus `text_offset`, all aligned with `token_ids`.
A `top_logprobs` dict is laid out as upstream's (`create_completion_logprobs` over the PyTorch
sampler's logprobs): the sampled id first, then the k most likely ids, best first, so k + 1
keys when the sampled id is not among the k best, k keys when it is (its second mention keeps
its first place); keyed by decoded string, so ids that decode alike collapse into one key (the
last value wins, the first place stays, as a dict comprehension does).

The values are deterministic stand-ins with a shape that makes the layout matter: at the
position of a sampled id `t` the most likely ids are `ranked(t, n)`, and `t` itself is only
the `sampled_rank(t)`-th of them (0: the best; 1 to 3: a less likely token was sampled, so the
dict's first key is not the best and, when k ≤ that rank, not one of the k best at all).
`token_logprob(t)` is its value there. An older build (`logprobs=False`) returns
`logprobs: null`. Sans-IO.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import orjson
from openai_harmony import HarmonyEncoding, HarmonyError

from proxy.simulator.completion_request import CompletionParams
from proxy.simulator.engine import EngineOutput

DONE: Final = b"data: [DONE]\n\n"
#: A frame cut off mid-JSON (the `malformed` fault).
MALFORMED: Final = b'data: {"id":"cmpl-0","object":"text_completion","choices":[{"index":0,\n\n'
#: The longest run of tokens one character can be split into (4 UTF-8 bytes).
_MAX_SPLIT = 4
#: Alternatives of `top_logprobs` are drawn from the ordinary tokens (o200k's below its specials).
_ORDINARY = 199_998


#: How many places a sampled id's rank cycles through (module doc).
_SAMPLED_RANKS = 4


def sampled_rank(token: int) -> int:
    """Where the sampled id `token` stands among the most likely ids at its position (0: the
    best), deterministic: 0 to 3, by the id."""
    return (token // 3) % _SAMPLED_RANKS


def _best_value(token: int) -> float:
    """The logprob of the most likely id at the position where `token` was sampled."""
    return -0.01 * (1 + token % 50)


def ranked(token: int, count: int) -> list[tuple[int, float]]:
    """The `count` most likely ids at the position where `token` was sampled and their
    logprobs, best first (strictly decreasing); `token` is the `sampled_rank(token)`-th."""
    sampled, best = sampled_rank(token), _best_value(token)
    return [
        (token if rank == sampled else (token + 7919 * (rank + 1)) % _ORDINARY, best - rank / 2)
        for rank in range(count)
    ]


def token_logprob(token: int) -> float:
    """The simulator's logprob of a sampled id (deterministic, in [-2, 0))."""
    return _best_value(token) - sampled_rank(token) / 2


def frame(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def error_frame(message: str, status: int = 500) -> bytes:
    """What newer servers send when the generation fails mid-stream (then `[DONE]`)."""
    error = {
        "object": "error",
        "message": message,
        "type": "InternalServerError",
        "param": None,
        "code": status,
    }
    return frame({"error": error})


def safe_decode(encoding: HarmonyEncoding, ids: Sequence[int]) -> str:
    """Lossy text of ids; U+FFFD for ids outside the vocab instead of an exception."""
    try:
        return encoding.decode(list(ids))
    except (HarmonyError, ValueError, OverflowError):
        return "\ufffd"


class Detokenizer:
    """Incremental text of generated ids (module doc)."""

    def __init__(self, encoding: HarmonyEncoding, *, skip_special_tokens: bool) -> None:
        self._encoding = encoding
        self._skip = skip_special_tokens
        self._pending: list[int] = []

    def feed(self, token_ids: Sequence[int], *, final: bool = False) -> str:
        if self._skip:
            token_ids = [t for t in token_ids if not self._special(t)]
        self._pending += token_ids
        if not self._pending:
            return ""
        keep = 0 if final else self._incomplete_tail()
        cut = len(self._pending) - keep
        ready, self._pending = self._pending[:cut], self._pending[cut:]
        return self._decode(ready)

    def _incomplete_tail(self) -> int:
        """How many trailing pending ids hold an unfinished character (0 when none do)."""
        for keep in range(min(_MAX_SPLIT, len(self._pending)) + 1):
            try:
                self._encoding.decode_utf8(self._pending[: len(self._pending) - keep])
            except (HarmonyError, ValueError, OverflowError):
                continue
            return keep
        return 0  # invalid inside, not just at the end: decode it lossily

    def _decode(self, ids: list[int]) -> str:
        return safe_decode(self._encoding, ids)

    def _special(self, token: int) -> bool:
        try:
            return bool(self._encoding.is_special_token(token))
        except (HarmonyError, ValueError, OverflowError):
            return False


class CompletionWriter:
    """Frames and bodies of one completion request (module doc)."""

    def __init__(
        self,
        encoding: HarmonyEncoding,
        params: CompletionParams,
        *,
        engine_id: int,
        created: int,
        prompt_tokens: int,
        prompt_text: str | None,
        logprobs: bool = True,
    ) -> None:
        self._encoding = encoding
        self._params = params
        self._logprobs_given = logprobs and bool(params.logprobs)
        self._id = f"cmpl-{engine_id}"
        self._created = created
        self._prompt_tokens = prompt_tokens
        self._echo = prompt_text if params.echo else None
        self._text = Detokenizer(encoding, skip_special_tokens=params.skip_special_tokens)
        self._offset = 0
        self.completion_tokens = 0

    def chunk(
        self, output: EngineOutput, *, without_token_ids: bool = False, bad_logprobs: bool = False
    ) -> bytes:
        """The frame of one engine output; `bad_logprobs` (a fault) drops its last logprob."""
        params, ids = self._params, list(output.token_ids)
        self.completion_tokens += len(ids)
        text = ""
        if params.detokenize or without_token_ids:
            text = self._text.feed(ids, final=output.finish_reason is not None)
        if self._echo is not None:
            text, self._echo = self._echo + text, None
        choice: dict[str, Any] = {
            "index": 0,
            "text": text if params.detokenize else "",
            "token_ids": None if params.detokenize or without_token_ids else ids,
            "logprobs": self._logprobs(ids) if self._logprobs_given else None,
            "finish_reason": output.finish_reason,
            "stop_reason": output.stop_reason,
            "avg_decoded_tokens_per_iter": None,
        }
        if bad_logprobs and choice["logprobs"] is not None:
            for key in ("text_offset", "token_logprobs", "tokens", "top_logprobs"):
                del choice["logprobs"][key][-1:]
        usage = self._usage() if params.continuous_usage else None
        return frame(self._envelope([choice], usage))

    def usage_frame(self) -> bytes:
        return frame(self._envelope([], self._usage()))

    def response(self, outputs: Sequence[EngineOutput], response_id: str) -> dict[str, Any]:
        """The non-streaming `CompletionResponse` for all outputs of a generation."""
        params = self._params
        ids = [token for output in outputs for token in output.token_ids]
        self.completion_tokens = len(ids)
        text = self._text.feed(ids, final=True) if params.detokenize else ""
        if self._echo is not None:
            text = self._echo + text
        last = outputs[-1]
        choice = {
            "index": 0,
            "text": text,
            "token_ids": None if params.detokenize else ids,
            "logprobs": self._logprobs(ids) if self._logprobs_given else None,
            "context_logits": None,
            "finish_reason": last.finish_reason,
            "stop_reason": last.stop_reason,
            "disaggregated_params": None,
            "avg_decoded_tokens_per_iter": None,
        }
        return {
            "id": response_id,
            "object": "text_completion",
            "created": self._created,
            "model": params.model,
            "choices": [choice],
            "usage": self._usage(),
            "prompt_token_ids": None,
        }

    def _envelope(self, choices: list[dict[str, Any]], usage: Any) -> dict[str, Any]:
        return {
            "id": self._id,
            "object": "text_completion",
            "created": self._created,
            "model": self._params.model,
            "choices": choices,
            "usage": usage,
        }

    def _usage(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self._prompt_tokens,
            "total_tokens": self._prompt_tokens + self.completion_tokens,
            "completion_tokens": self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
        }

    def _logprobs(self, ids: Sequence[int]) -> dict[str, Any]:
        encoding, count = self._encoding, self._params.logprobs or 0
        tokens = [safe_decode(encoding, [token]) for token in ids]
        values = [token_logprob(token) for token in ids]
        offsets = []
        for text in tokens:
            offsets.append(self._offset)
            self._offset += len(text)
        top = []
        for token, text, value in zip(ids, tokens, values, strict=True):
            # The sampled id first, then the `count` best (module doc): a dict built from that
            # list, as upstream's comprehension builds it.
            listed = [(text, value)]
            listed += [(safe_decode(encoding, [other]), lp) for other, lp in ranked(token, count)]
            top.append(dict(listed))
        return {
            "text_offset": offsets,
            "token_logprobs": values,
            "tokens": tokens,
            "top_logprobs": top,
        }
