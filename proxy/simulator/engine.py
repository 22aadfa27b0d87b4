"""The simulated engine: generated ids → the engine outputs trtllm-serve streams, with finish.

Theory of operation
-------------------
`generate` takes what the model writes (an iterator of ids) and applies the sampling rules of
TensorRT-LLM's `GenerationResultBase._handle_sequence` (executor/result.py):

- the end id `<|return|>` (200002, gpt-oss's EOS) ends it with `finish_reason: "stop"` and
  `stop_reason: null` (FinishReason.END_ID), unless `ignore_eos`; whether the token stays in
  the ids is not known for upstream, so both are modelled (`return_in_ids`);
- an id in `stop_token_ids` ends it with `"stop"` and `stop_reason` = that id
  (FinishReason.STOP_WORDS); the id is cut from the ids unless `include_stop_str_in_output`;
- `max_tokens` (default: what `max_seq_len` leaves after the prompt) ends it with `"length"`;
- a replay that runs out of ids without any of these ends like a stripped end id.

`group` then cuts the raw ids (the stop token included: the engine did generate it) into engine
outputs as trtllm-serve streams them: the first output carries one token, every further one
`stream_interval` tokens (or, `uneven`, the tokens accepted in `stream_interval` speculative
iterations of 1 … draft+1 tokens each), the last one the rest, with the finish; explicit `sizes`
come first (0 is an output without tokens). A cut stop token is then removed from the output that
carries it (the last one, unless explicit sizes add empty outputs after it), which may leave it
empty — exactly the fixtures' `stripped` mode. `split_at` splits outputs at
token counts (so a fault fires after exactly K tokens). Each output carries the seconds to wait
before it (`Pacing`). Sans-IO: the shell sleeps.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from proxy.harmony.tokens import RETURN

EOS = RETURN


@dataclass(frozen=True, slots=True)
class Sampling:
    """The request's stop rules (`CompletionRequest.to_sampling_params`, the parts that matter)."""

    max_tokens: int | None = None
    stop_token_ids: frozenset[int] = frozenset()
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False


@dataclass(frozen=True, slots=True)
class Generation:
    """The finished generation: raw ids (with the stop token), how it ended, and whether the
    stop token is cut from what is delivered."""

    raw_ids: tuple[int, ...]
    finish_reason: str
    stop_reason: int | None
    cut_last: bool

    @property
    def token_ids(self) -> tuple[int, ...]:
        """The ids the client gets (`output.token_ids`)."""
        return self.raw_ids[:-1] if self.cut_last else self.raw_ids


@dataclass(frozen=True, slots=True)
class Grouping:
    """How generated ids are cut into engine outputs (module doc)."""

    stream_interval: int = 20
    uneven: bool = False
    draft_tokens: int = 3
    seed: int = 0
    sizes: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Pacing:
    """Seconds to the first output, and per generated token after it."""

    first_token_seconds: float = 0.0
    token_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class EngineOutput:
    """One engine output: its new ids (`token_ids_diff`), the finish on the last one, and the
    seconds to wait before it is available."""

    token_ids: tuple[int, ...]
    finish_reason: str | None = None
    stop_reason: int | None = None
    delay: float = 0.0


def generate(
    ids: Iterable[int], sampling: Sampling, *, limit: int, return_in_ids: bool
) -> Generation:
    """Run the model's ids through the stop rules (module doc); `limit` is `max_seq_len` minus
    the prompt length, the cap when `max_tokens` is not given."""
    cap = limit if sampling.max_tokens is None else min(sampling.max_tokens, limit)
    raw: list[int] = []
    for token in itertools.islice(ids, max(cap, 0)):
        raw.append(token)
        if token == EOS and not sampling.ignore_eos:
            return Generation(tuple(raw), "stop", None, cut_last=not return_in_ids)
        if token in sampling.stop_token_ids:
            cut = not sampling.include_stop_str_in_output
            return Generation(tuple(raw), "stop", token, cut_last=cut)
    if len(raw) >= cap:
        return Generation(tuple(raw), "length", None, cut_last=False)
    return Generation(tuple(raw), "stop", None, cut_last=False)


def group(generation: Generation, grouping: Grouping, pacing: Pacing) -> list[EngineOutput]:
    """The engine outputs of a generation (module doc)."""
    raw = generation.raw_ids
    sizes = _sizes(len(raw), grouping)
    outputs: list[EngineOutput] = []
    position = 0
    for index, size in enumerate(sizes):
        chunk = raw[position : position + size]
        position += size
        if index == 0:
            delay = pacing.first_token_seconds + max(size - 1, 0) * pacing.token_seconds
        else:
            delay = max(size, 1) * pacing.token_seconds  # an empty output is one iteration
        outputs.append(EngineOutput(chunk, delay=delay))
    if generation.cut_last:  # the output that carries the stop token loses it
        index = max(i for i, output in enumerate(outputs) if output.token_ids)
        outputs[index] = replace(outputs[index], token_ids=outputs[index].token_ids[:-1])
    outputs[-1] = replace(
        outputs[-1], finish_reason=generation.finish_reason, stop_reason=generation.stop_reason
    )
    return outputs


def _sizes(total: int, grouping: Grouping) -> list[int]:
    """Output sizes covering `total` ids: the explicit ones (zeros right after the last id
    included), then the first-one-token rule, then intervals."""
    sizes: list[int] = []
    left = total
    for size in grouping.sizes:
        if left == 0 and size > 0:
            break
        take = min(size, left)
        sizes.append(take)
        left -= take
    if left == 0:
        return sizes or [0]
    if not sizes:
        sizes.append(1)
        left -= 1
    rng = random.Random(f"{grouping.seed}/{total}")
    while left > 0:
        if grouping.uneven:
            size = sum(
                rng.randint(1, grouping.draft_tokens + 1) for _ in range(grouping.stream_interval)
            )
        else:
            size = grouping.stream_interval
        take = min(size, left)
        sizes.append(take)
        left -= take
    return sizes


def split_at(outputs: Sequence[EngineOutput], positions: Iterable[int]) -> list[EngineOutput]:
    """The same outputs, split so that each position (a count of delivered ids) falls between
    two outputs; the finish stays on the last part, the delay is shared by token count."""
    cuts = sorted({p for p in positions if p > 0})
    result: list[EngineOutput] = []
    delivered = 0
    for output in outputs:
        inside = [p - delivered for p in cuts if delivered < p < delivered + len(output.token_ids)]
        start = 0
        for cut in inside:
            part = output.token_ids[start:cut]
            share = output.delay * len(part) / len(output.token_ids)
            result.append(EngineOutput(part, delay=share))
            start = cut
        if inside:
            rest = output.token_ids[start:]
            share = output.delay * len(rest) / len(output.token_ids)
            result.append(replace(output, token_ids=rest, delay=share))
        else:
            result.append(output)
        delivered += len(output.token_ids)
    return result
