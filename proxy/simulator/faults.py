"""Fault specs: what can go wrong on the wire, parsed once, fired by the streaming shell.

Grammar (also in the package docstring)::

    SPEC   := "none" | FAULT ("," FAULT)*
    FAULT  := "http:" CODE              answer HTTP CODE (400-599) with upstream's error body,
                                        before the first byte
            | "cut" ["@" K]             close the connection after K generated tokens (default 0)
            | "stall" ["@" K] ":" S     after K tokens, send nothing for S seconds, then go on
            | "malformed" ["@" K]       after K tokens, one frame whose data is not JSON
            | "no-token-ids" ["@" K]    the next frame after K tokens has `token_ids: null`
            | "bad-logprobs" ["@" K]    /v1/completions asked for logprobs: the next frame
                                        after K tokens has one logprob fewer than token ids
            | "error" ["@" K]           after K tokens, `data: {"error": …}` then `data: [DONE]`
            | "eof" ["@" K]             after K tokens, end the body cleanly: no finish, no [DONE]
            | "done" ["@" K]            after K tokens, `data: [DONE]` without a finish frame

A fault "after K tokens" fires once, at the first point where at least K generated tokens have
been sent (K = 0: before the first one); the engine splits its outputs at K so the count is exact.
Sans-IO: this module only parses and describes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Final, Literal

FaultKind = Literal[
    "http", "cut", "stall", "malformed", "no-token-ids", "bad-logprobs", "error", "eof", "done"
]

#: Kinds that fire at a token position of a stream.
STREAM_KINDS: Final = frozenset(
    {"cut", "stall", "malformed", "no-token-ids", "bad-logprobs", "error", "eof", "done"}
)
#: Kinds that mean something only in `data:`-framed streams (`/v1/completions`, chat).
DATA_FRAME_KINDS: Final = frozenset({"no-token-ids", "bad-logprobs", "error", "done"})

_FAULT = re.compile(
    r"^(?P<kind>http|cut|stall|malformed|no-token-ids|bad-logprobs|error|eof|done)"
    r"(?:@(?P<after>\d+))?(?::(?P<arg>[^,]+))?$"
)


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: `kind`, the token count it fires after, and its argument."""

    kind: FaultKind
    after: int = 0
    status: int = 0  # http
    seconds: float = 0.0  # stall

    @property
    def spec(self) -> str:
        """The fault written back in the grammar (for records and logs)."""
        if self.kind == "http":
            return f"http:{self.status}"
        if self.kind == "stall":
            return f"stall@{self.after}:{self.seconds:g}"
        return f"{self.kind}@{self.after}"


def parse_faults(spec: str) -> tuple[Fault, ...]:
    """Parse a fault spec (module doc); raise ValueError naming the bad part."""
    text = spec.strip()
    if text.lower() in ("", "none"):
        return ()
    return tuple(_parse_one(part.strip()) for part in text.split(","))


def _parse_one(part: str) -> Fault:
    match = _FAULT.match(part)
    if match is None:
        raise ValueError(f"unknown fault {part!r} (see the grammar in proxy.simulator)")
    kind: FaultKind = match["kind"]  # type: ignore[assignment]
    after = int(match["after"] or 0)
    arg = match["arg"]
    if kind == "http":
        if match["after"] is not None or arg is None or not arg.isdigit():
            raise ValueError(f"fault {part!r}: write http:CODE, e.g. http:500")
        status = int(arg)
        if not 400 <= status <= 599:
            raise ValueError(f"fault {part!r}: the status must be 400-599")
        return Fault("http", status=status)
    if kind == "stall":
        try:
            seconds = float(arg) if arg is not None else math.nan
        except ValueError:
            seconds = math.nan
        if not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"fault {part!r}: write stall@K:SECONDS, e.g. stall@5:2.5")
        return Fault("stall", after=after, seconds=seconds)
    if arg is not None:
        raise ValueError(f"fault {part!r}: {kind} takes no argument")
    return Fault(kind, after=after)


def http_fault(faults: tuple[Fault, ...]) -> Fault | None:
    """The first `http:CODE` fault, which answers before anything else happens."""
    return next((fault for fault in faults if fault.kind == "http"), None)


def stream_faults(faults: tuple[Fault, ...], *, data_frames: bool) -> tuple[Fault, ...]:
    """The faults that fire inside a stream, in firing order; `data_frames` is False for the
    Responses stream, where only cut, stall, malformed and eof mean anything."""
    kinds = STREAM_KINDS if data_frames else STREAM_KINDS - DATA_FRAME_KINDS
    return tuple(sorted((f for f in faults if f.kind in kinds), key=lambda f: f.after))
