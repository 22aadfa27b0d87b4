"""The simulator's settings: one frozen object, validated once, shared by every request.

Defaults describe an unpatched trtllm-serve serving gpt-oss as the shipped configs run it
(`stream_interval: 20`), with a pace a person can watch (about 100 tokens per second). Tests pass
`token_seconds=0` and `first_token_seconds=0`. Per-request headers (`X-Sim-*`, see the package
docstring) override the knobs marked "per request" for one request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from proxy.simulator.faults import parse_faults


@dataclass(frozen=True, slots=True)
class SimulatorConfig:
    """What the simulated server is and how its engine behaves.

    - `model`: the served model name (`/v1/models`, the Responses `model` field).
    - `stream_interval`: tokens per engine output after the first, which carries one (trtllm's
      `stream_interval`; per request `X-Sim-Stream-Interval`).
    - `first_token_seconds`, `token_seconds`: time to the first output, time per further token
      (an output of k tokens arrives k * `token_seconds` after the previous one).
    - `uneven`, `draft_tokens`: speculative-decoding-like outputs: each of the `stream_interval`
      iterations behind one output accepts 1 … `draft_tokens` + 1 tokens, drawn from a RNG seeded
      with `seed` and the request (per request `X-Sim-Uneven`).
    - `return_in_ids`: whether the end token `<|return|>` (200002, gpt-oss's EOS) appears in the
      generated ids; unverified upstream, so both are served (per request `X-Sim-Stop-Mode`).
    - `fault`: a fault spec applied to every generation request without an `X-Sim-Fault` header.
    - `sim_tokens`: the scripted model's minimum completion length (per request `X-Sim-Tokens`).
    - `preamble`: the scripted model writes a commentary preamble (per request `X-Sim-Preamble`).
    - `replay`: token ids every generation returns instead of the scripted model's (per request
      `X-Sim-Replay`).
    - `postprocess_workers`: model upstream's postprocess workers (the shipped configs use 4):
      Responses `sequence_number` restarts at 0 after the two opening events.
    - `max_seq_len`: prompt plus completion limit; without `max_tokens` a generation may run to it.
    - `completion_logprobs`: `/v1/completions` answers `logprobs: k` (builds from early 2026);
      False models an older build, which takes the field and returns
      `logprobs: null`.
    - `guided_decoding`: the server was started with a guided-decoding backend
      (`guided_decoding_backend: xgrammar`), so a `/v1/completions` `response_format` is
      enforced; False models a stock server, which takes `response_format` and ignores it
      (guided.py: its scripted model then writes what the format forbids, when it can).
    - `version`: what `GET /version` reports.
    - `record_limit`: how many request records `app.state.simulator.requests` keeps.
    - `max_body_bytes`: the largest request body accepted (413 beyond).
    """

    model: str = "openai/gpt-oss-120b"
    stream_interval: int = 20
    first_token_seconds: float = 0.05
    token_seconds: float = 0.01
    uneven: bool = False
    draft_tokens: int = 3
    return_in_ids: bool = True
    fault: str | None = None
    seed: int = 0
    sim_tokens: int | None = None
    preamble: bool = False
    replay: tuple[int, ...] | None = None
    postprocess_workers: bool = False
    max_seq_len: int = 131072
    completion_logprobs: bool = True
    guided_decoding: bool = True
    version: str = "1.2.0"
    record_limit: int = 1000
    max_body_bytes: int = 32 * 1024 * 1024

    def __post_init__(self) -> None:
        _check(self.stream_interval >= 1, "stream_interval", self.stream_interval, "≥ 1")
        _check(self.draft_tokens >= 0, "draft_tokens", self.draft_tokens, "≥ 0")
        for name in ("first_token_seconds", "token_seconds"):
            value = getattr(self, name)
            _check(math.isfinite(value) and value >= 0, name, value, "a finite number ≥ 0")
        if self.sim_tokens is not None:
            _check(self.sim_tokens >= 0, "sim_tokens", self.sim_tokens, "≥ 0")
        _check(self.max_seq_len >= 1, "max_seq_len", self.max_seq_len, "≥ 1")
        _check(self.record_limit >= 1, "record_limit", self.record_limit, "≥ 1")
        _check(self.max_body_bytes >= 1, "max_body_bytes", self.max_body_bytes, "≥ 1")
        _check(bool(self.model), "model", self.model, "a non-empty name")
        if self.replay is not None:
            _check(all(0 <= token < 2**32 for token in self.replay), "replay", "…", "u32 token ids")
        if self.fault is not None:
            try:
                parse_faults(self.fault)
            except ValueError as exc:
                raise ValueError(f"SimulatorConfig.fault={self.fault!r}: {exc}") from exc


def _check(ok: bool, name: str, value: object, expected: str) -> None:
    if not ok:
        raise ValueError(f"SimulatorConfig.{name}={value!r}: must be {expected}")
