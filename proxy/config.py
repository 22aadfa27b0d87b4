"""Settings: one frozen object, parsed once, from defaults < config file < env < CLI flags.

Every setting is declared once in `FIELDS` (name, type, default, help). From that table come the
environment variables (`PROXY_<NAME>`), the CLI flags (`--<name-with-dashes>`), the keys of the
TOML config file (`config/proxy.example.toml`) and the README's settings table (a test keeps
them in step). A bad value fails at start with an error naming the setting, where it came from,
and the value.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy import config_values as values
from proxy.harmony.reasoning_seal import parse_keys
from proxy.store import check_store_url

ENV_PREFIX = "PROXY_"
CONFIG_ENV = "PROXY_CONFIG"


class ConfigError(ValueError):
    """A setting has a bad value; the message names the setting, its source and the value."""


@dataclass(frozen=True, slots=True)
class Field:
    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    aliases: tuple[str, ...] = ()
    #: Its value never appears in an error message (keys).
    secret: bool = False

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


# fmt: off
FIELDS: tuple[Field, ...] = (
    Field("upstream_url", values.url, None,
          "trtllm-serve base URL, e.g. http://127.0.0.1:8000; unset: run the built-in simulator",
          ("--upstream",)),
    Field("host", str, "0.0.0.0", "address to listen on"),
    Field("port", values.port, 8080, "port to listen on"),
    Field("metrics_port", values.port, None,
          "serve /metrics on this port as well (unset: only on the main port)"),
    Field("workers", values.workers, 1,
          "proxy processes serving the port, each on its own core (issue 17); auto (or 0): "
          "the CPUs this process may use, its affinity and cgroup CPU limit included"),
    Field("repair_models", values.globs, ("*",),
          "comma-separated model names or globs whose /v1/responses is repaired; "
          "others pass through"),
    Field("connect_timeout", values.positive_float, 5.0, "seconds to connect to upstream"),
    Field("first_token_timeout", values.positive_float, 300.0,
          "seconds from the request to upstream's first token "
          "(prefill of long prompts under load)"),
    Field("idle_timeout", values.positive_float, 120.0,
          "seconds allowed between two upstream tokens once they flow (frames without tokens "
          "do not count); in pass-through, between two reads of upstream's body"),
    Field("send_timeout", values.positive_float, 60.0,
          "seconds a client may accept nothing (not reading) before its stream is dropped "
          "and its upstream request released"),
    Field("keepalive_interval", values.positive_float, 15.0,
          "seconds of silence after which a `: keepalive` SSE comment is sent"),
    Field("drain_timeout", values.positive_float, 30.0,
          "on SIGTERM, seconds in-flight streams may take to finish before they are failed"),
    Field("drain_linger", values.non_negative_float, 1.0,
          "on SIGTERM, seconds the listener stays open at least (probes and new requests get "
          "503) even when nothing is in flight; it closes at drain_timeout at the latest"),
    Field("render_workers", values.non_negative_int, 1,
          "processes that validate and render /v1/responses requests off the event loop "
          "(0: render on the event loop, the old behaviour)"),
    Field("render_timeout", values.positive_float, 20.0,
          "seconds a request may take to render (400 above it, the worker is replaced), and "
          "wait for a free render worker (429 above it)"),
    Field("render_queue", values.positive_int, 32,
          "requests that may wait for a render worker at once; more get 429 with Retry-After"),
    Field("body_budget_bytes", values.non_negative_int, 64 * 1024 * 1024,
          "request body bytes read and rendered at once, over all requests (0: no budget)"),
    Field("body_budget_wait", values.non_negative_float, 5.0,
          "seconds a request waits for room in body_budget_bytes before a 503 with Retry-After"),
    Field("max_body_bytes", values.non_negative_int, 16 * 1024 * 1024,
          "largest request body accepted (413 above it)"),
    Field("max_prompt_tokens", values.positive_int, 131_072,
          "the model's context in tokens (gpt-oss: 131072): prompt + max_output_tokens above "
          "it is a 400, or with truncation 'auto' the oldest input items are dropped to fit"),
    Field("max_concurrent_streams", values.non_negative_int, 0,
          "repaired requests served at once; more get 429 with Retry-After (0: no limit)"),
    # HTTP server limits on the client side (issue 12; nginx/Envoy semantics,
    # proxy/server/http/guard.py)
    Field("max_header_bytes", values.positive_int, 64 * 1024,
          "largest request head (request target and header lines) accepted; 431 above it"),
    Field("max_headers", values.positive_int, 100,
          "most header lines a request may have; 431 above it"),
    Field("header_timeout", values.positive_float, 10.0,
          "seconds a client may take to send a whole request head (from its first byte, or "
          "from connecting); then 408 and close (slowloris)"),
    Field("body_timeout", values.positive_float, 30.0,
          "seconds a request body may pause; after its first body_timeout seconds it must "
          "also average body_min_rate (it is cut at body_timeout + bytes received / "
          "body_min_rate); else 408"),
    Field("body_min_rate", values.non_negative_int, 1024,
          "bytes per second a request body must average once it took body_timeout seconds "
          "(0: no minimum)"),
    Field("keepalive_timeout", values.positive_float, 75.0,
          "seconds an idle keep-alive client connection stays open (above the 5 s of "
          "common client pools, so the client closes first)"),
    Field("max_connections", values.non_negative_int, 2048,
          "open client connections; over it the oldest connection without a whole request "
          "head is closed, else the longest-idle keep-alive one, never one with a request in "
          "flight; with none to close the new connection gets 503 (0: no cap; lowered to fit "
          "the open-file limit)"),
    Field("trusted_proxies", values.addresses, (),
          "comma-separated IPs or CIDR blocks of proxies in front of this one: their "
          "X-Forwarded-For chain is appended to and names the client; from other peers "
          "forwarding headers are replaced"),
    Field("passthrough_when_incapable", values.boolean, False,
          "when upstream cannot return token ids, pass /v1/responses through unrepaired "
          "instead of answering 502"),
    Field("guided_decoding", values.choice("auto", "on", "off"), "auto",
          "whether upstream enforces response_format (tool_choice and text.format as guided "
          "decoding; trtllm-serve only with guided_decoding_backend set): auto probes it at "
          "start and every 30 s, on/off state it"),
    Field("unenforced_constraints", values.choice("refuse", "best_effort"), "refuse",
          "a request with tool_choice none/required/named/allowed_tools or text.format "
          "json_schema/json_object when upstream does not enforce response_format: refuse "
          "(400 constraint_not_enforced), or best_effort (generate, check the output, and end "
          "a response that breaks the constraint failed, constraint_violated)"),
    Field("delta_mode", values.choice("coalesce", "per_token"), "coalesce",
          "coalesce: one delta event per item per upstream frame; per_token: one per token"),
    Field("metrics_models", values.names, (),
          "model names allowed as metric label values (others are counted as 'other')"),
    Field("event_loop", values.choice("auto", "uvloop", "asyncio"), "auto",
          "auto: uvloop when installed (it is in the pinned set), else asyncio's own loop"),
    Field("log_level", values.choice("debug", "info", "warning", "error"), "info", "log level"),
    Field("log_format", values.choice("json", "text"), "json", "one JSON object per line, or text"),
    Field("log_content", values.boolean, False,
          "debug only: log prompts and outputs (never enable in production)"),
    Field("reasoning_keys", parse_keys, (),
          "AES-256-GCM keys for include reasoning.encrypted_content, ID:BASE64 comma-separated, "
          "newest first (it seals, all open: rotate by prepending); unset: one random key per "
          "process, so blobs do not survive a restart or cross replicas",
          secret=True),

    Field("store_url", check_store_url, "embedded",
          "where responses and conversations are stored (issues 13, 16): embedded (SQLite in "
          "data_dir, shared by the processes of one host), redis://HOST:PORT/DB (replicas), "
          "memory:// (tests), or off"),
    Field("data_dir", str, "data",
          "directory of the embedded store (a volume in the deploy files)"),
    Field("store_ttl", values.positive_float, 30 * 24 * 3600.0,
          "seconds a stored response is kept (OpenAI keeps them 30 days)"),
    Field("store_max_bytes", values.non_negative_int, 1024**3,
          "bytes the store may hold; past it the oldest responses are evicted (0: no bound)"),
    Field("store_scope_header", values.header_name, "authorization",
          "request header whose value (hashed) scopes stored responses: a response is visible "
          "only to requests with the same value (Authorization: its bearer token)"),
    Field("store_timeout", values.positive_float, 5.0,
          "seconds a request waits for the store before answering 503 (a foreground stream "
          "never waits longer than this for its last write, and never fails for it)"),
    Field("simulator_stream_interval", values.positive_int, 20,
          "built-in simulator: tokens per engine output after the first (trtllm stream_interval)"),
    Field("simulator_token_seconds", values.non_negative_float, 0.01,
          "built-in simulator: seconds per generated token"),
    Field("simulator_guided_decoding", values.boolean, True,
          "built-in simulator: enforce response_format, as trtllm-serve with a guided-decoding "
          "backend does (false: accept and ignore it, as a stock trtllm-serve does)"),
)
# fmt: on


@dataclass(frozen=True, slots=True)
class Settings:
    """The proxy's configuration (see `FIELDS` for meanings and defaults)."""

    upstream_url: str | None = None
    host: str = "0.0.0.0"
    port: int = 8080
    metrics_port: int | None = None
    #: 0: auto.
    workers: int = 1
    repair_models: tuple[str, ...] = ("*",)
    connect_timeout: float = 5.0
    first_token_timeout: float = 300.0
    idle_timeout: float = 120.0
    send_timeout: float = 60.0
    keepalive_interval: float = 15.0
    drain_timeout: float = 30.0
    drain_linger: float = 1.0
    render_workers: int = 1
    render_timeout: float = 20.0
    render_queue: int = 32
    body_budget_bytes: int = 64 * 1024 * 1024
    body_budget_wait: float = 5.0
    max_body_bytes: int = 16 * 1024 * 1024
    max_prompt_tokens: int = 131_072
    max_concurrent_streams: int = 0
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout: float = 10.0
    body_timeout: float = 30.0
    body_min_rate: int = 1024
    keepalive_timeout: float = 75.0
    max_connections: int = 2048
    trusted_proxies: tuple[str, ...] = ()
    passthrough_when_incapable: bool = False
    guided_decoding: str = "auto"
    unenforced_constraints: str = "refuse"
    delta_mode: str = "coalesce"
    metrics_models: tuple[str, ...] = ()
    event_loop: str = "auto"
    log_level: str = "info"
    log_format: str = "json"
    log_content: bool = False
    reasoning_keys: tuple[tuple[str, bytes], ...] = dataclasses.field(default=(), repr=False)

    store_url: str = "embedded"
    data_dir: str = "data"
    store_ttl: float = 30 * 24 * 3600.0
    store_max_bytes: int = 1024**3
    store_scope_header: str = "authorization"
    store_timeout: float = 5.0
    simulator_stream_interval: int = 20
    simulator_token_seconds: float = 0.01
    simulator_guided_decoding: bool = True

    def repairs(self, model: str) -> bool:
        """Whether `/v1/responses` for `model` goes through the repair."""
        return any(fnmatch.fnmatchcase(model, glob) for glob in self.repair_models)


def _parse(field: Field, raw: Any, source: str) -> Any:
    text = ",".join(map(str, raw)) if isinstance(raw, list) else str(raw)
    if isinstance(raw, bool):
        text = "true" if raw else "false"
    try:
        return field.parse(text)
    except ValueError as exc:
        shown = "<secret>" if field.secret else repr(text)
        raise ConfigError(f"{source}={shown}: {exc}") from None


def load_file(path: Path) -> dict[str, Any]:
    """Read a TOML config file (keys are setting names)."""
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"config file {str(path)!r}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r}: {exc}") from None
    known = {field.name for field in FIELDS}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"config file {str(path)!r}: unknown setting(s) {', '.join(unknown)}")
    return data


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One `--flag` per setting (values parsed later, so errors read the same for every source)."""
    parser.add_argument("--config", help=f"TOML config file (also {CONFIG_ENV})")
    for field in FIELDS:
        parser.add_argument(
            field.flag, *field.aliases, dest=field.name, default=None, help=field.help
        )


def load_settings(
    env: Mapping[str, str], args: argparse.Namespace | None = None, *, base: Settings | None = None
) -> Settings:
    """Settings from (lowest first) `base` defaults, the config file, `env`, then CLI `args`."""
    values: dict[str, Any] = {}
    config_path = getattr(args, "config", None) or env.get(CONFIG_ENV)
    file_values = load_file(Path(config_path)) if config_path else {}
    for field in FIELDS:
        flag_value = getattr(args, field.name, None) if args is not None else None
        if flag_value is not None:
            values[field.name] = _parse(field, flag_value, field.flag)
        elif env.get(field.env) not in (None, ""):
            values[field.name] = _parse(field, env[field.env], field.env)
        elif field.name in file_values:
            values[field.name] = _parse(
                field, file_values[field.name], f"{config_path}:{field.name}"
            )
    return dataclasses.replace(base or Settings(), **values)


def settings_table() -> str:
    """The README's settings table (Markdown), generated from `FIELDS`."""
    rows = ["| setting | env | flag | default | meaning |", "| --- | --- | --- | --- | --- |"]
    for field in FIELDS:
        default = field.default
        if isinstance(default, tuple):
            default = ",".join(default) if default else "(none)"
        elif default is None:
            default = "(unset)"
        elif isinstance(default, bool):
            default = str(default).lower()
        rows.append(
            f"| `{field.name}` | `{field.env}` | `{field.flag}` | `{default}` | {field.help} |"
        )
    return "\n".join(rows)


def check_consistent() -> None:
    """FIELDS and Settings must declare the same names and defaults (a test calls this)."""
    declared = {f.name: f.default for f in FIELDS}
    dataclass_defaults = {f.name: f.default for f in dataclasses.fields(Settings)}
    if declared != dataclass_defaults:
        raise AssertionError(f"FIELDS {declared} != Settings {dataclass_defaults}")


def parse_flags(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)
