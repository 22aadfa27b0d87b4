"""Per-request simulator knobs, read from `X-Sim-*` headers over the server's defaults.

Headers (names case-insensitive; grammar also in the package docstring):

    X-Sim-Fault: SPEC                fault spec (faults.py); "none" disables the server's default
    X-Sim-Tokens: N                  the scripted model writes at least N tokens
    X-Sim-Preamble: 0|1              the scripted model writes a commentary preamble
    X-Sim-Replay: IDS                generate exactly these token ids (comma/space separated, or
                                     a JSON list) instead of the scripted model's
    X-Sim-Chunks: SIZES              the first engine outputs carry these many tokens (0: an
                                     output without tokens); the rest as usual
    X-Sim-Stream-Interval: N         tokens per engine output after the first
    X-Sim-Uneven: off|on|SEED        speculative-decoding-like output sizes (SEED: on, seeded)
    X-Sim-Stop-Mode: kept|stripped   the token that ended generation stays in the ids or is cut
                                     (overrides `include_stop_str_in_output` and the server's
                                     `return_in_ids`)

A bad value is the client's error: `OptionError`, answered 400 in upstream's error shape. Sans-IO.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import orjson

from proxy.simulator.config import SimulatorConfig
from proxy.simulator.faults import Fault, parse_faults

PREFIX = "x-sim-"
StopMode = Literal["kept", "stripped"]


class OptionError(ValueError):
    """An `X-Sim-*` header has a value the simulator cannot use."""


@dataclass(frozen=True, slots=True)
class Options:
    """The knobs of one request (module doc)."""

    faults: tuple[Fault, ...] = ()
    sim_tokens: int | None = None
    preamble: bool = False
    replay: tuple[int, ...] | None = None
    chunks: tuple[int, ...] = ()
    stream_interval: int = 20
    uneven: bool = False
    seed: int = 0
    stop_mode: StopMode | None = None


def read_options(
    headers: Mapping[str, str], config: SimulatorConfig, *, generation: bool = True
) -> Options:
    """The knobs for a request with these (lower-cased) headers. The server's default fault
    applies to generation routes only, so `/health` stays up under a default fault."""
    fault_spec = headers.get("x-sim-fault", config.fault if generation else None)
    try:
        faults = parse_faults(fault_spec) if fault_spec is not None else ()
    except ValueError as exc:
        raise OptionError(f"X-Sim-Fault: {exc}") from exc
    seed, uneven = config.seed, config.uneven
    if (value := headers.get("x-sim-uneven")) is not None:
        seed, uneven = _uneven(value, seed)
    replay = config.replay
    if (value := headers.get("x-sim-replay")) is not None:
        replay = _ids("X-Sim-Replay", value)
    return Options(
        faults=faults,
        sim_tokens=_int(headers, "x-sim-tokens", config.sim_tokens, minimum=0),
        preamble=_flag(headers, "x-sim-preamble", config.preamble),
        replay=replay,
        chunks=_ids("X-Sim-Chunks", headers["x-sim-chunks"]) if "x-sim-chunks" in headers else (),
        stream_interval=_int(headers, "x-sim-stream-interval", config.stream_interval, minimum=1)
        or config.stream_interval,
        uneven=uneven,
        seed=seed,
        stop_mode=_stop_mode(headers.get("x-sim-stop-mode")),
    )


def parse_ids(text: str) -> tuple[int, ...]:
    """Token ids written as a JSON list or separated by commas and/or whitespace."""
    text = text.strip()
    if text.startswith("["):
        values = orjson.loads(text)
        if not isinstance(values, list) or not all(type(v) is int for v in values):
            raise ValueError("a JSON list of integers is expected")
        ids = tuple(values)
    else:
        ids = tuple(int(part) for part in text.replace(",", " ").split())
    if not all(0 <= token < 2**32 for token in ids):
        raise ValueError("token ids are u32")
    return ids


def _ids(name: str, value: str) -> tuple[int, ...]:
    try:
        return parse_ids(value)
    except ValueError as exc:  # orjson.JSONDecodeError is a ValueError
        raise OptionError(f"{name}: {exc}") from exc


def _int(headers: Mapping[str, str], name: str, default: int | None, *, minimum: int) -> int | None:
    value = headers.get(name)
    if value is None:
        return default
    try:
        number = int(value.strip())
    except ValueError:
        number = minimum - 1
    if number < minimum:
        raise OptionError(f"{_title(name)}: {value!r} is not an integer ≥ {minimum}")
    return number


def _flag(headers: Mapping[str, str], name: str, default: bool) -> bool:
    value = headers.get(name)
    if value is None:
        return default
    text = value.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise OptionError(f"{_title(name)}: {value!r} is not 0 or 1")


def _uneven(value: str, seed: int) -> tuple[int, bool]:
    text = value.strip().lower()
    if text in ("on", "1", "true", "yes"):
        return seed, True
    if text in ("off", "0", "false", "no"):
        return seed, False
    try:
        return int(text), True
    except ValueError:
        raise OptionError(f"X-Sim-Uneven: {value!r} is not off, on or a seed") from None


def _stop_mode(value: str | None) -> StopMode | None:
    if value is None:
        return None
    text = value.strip().lower()
    if text == "kept":
        return "kept"
    if text == "stripped":
        return "stripped"
    raise OptionError(f"X-Sim-Stop-Mode: {value!r} is not kept or stripped")


def _title(name: str) -> str:
    return "-".join(part.capitalize() for part in name.split("-"))
