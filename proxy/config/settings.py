"""`Settings`: every setting of the proxy, declared once as a field (`setting(...)`, values.py):
its type, its default, its parser, its help, its flag aliases, whether it is a secret."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass

from proxy.config import values
from proxy.config.values import setting
from proxy.harmony.reasoning_seal import parse_keys
from proxy.store import check_store_url


# fmt: off
@dataclass(frozen=True, slots=True)
class Settings:
    """The proxy's configuration; each field's help says what it means."""

    upstream_url: str | None = setting(
        None, values.url,
        "trtllm-serve base URL, e.g. http://127.0.0.1:8000; unset: run the built-in simulator",
        aliases=("--upstream",), example="http://127.0.0.1:8000")
    host: str = setting("0.0.0.0", str, "address to listen on")
    port: int = setting(8080, values.port, "port to listen on")
    metrics_port: int | None = setting(
        None, values.port, "serve /metrics on this port as well (unset: only on the main port)",
        example=9090)
    #: 0: auto, resolved at start.
    workers: int = setting(
        1, values.workers,
        "proxy processes serving the port, each on its own core; auto (or 0): the CPUs this "
        "process may use, its affinity and cgroup CPU limit included",
        example="auto")
    repair_models: tuple[str, ...] = setting(
        ("*",), values.globs,
        "comma-separated model names or globs whose /v1/responses is repaired; others pass "
        "through")
    connect_timeout: float = setting(5.0, values.positive_float, "seconds to connect to upstream")
    first_token_timeout: float = setting(
        300.0, values.positive_float,
        "seconds from the request to upstream's first token (prefill of long prompts under load)")
    idle_timeout: float = setting(
        120.0, values.positive_float,
        "seconds allowed between two upstream tokens once they flow (frames without tokens do "
        "not count); in pass-through, between two reads of upstream's body")
    send_timeout: float = setting(
        60.0, values.positive_float,
        "seconds a client may accept nothing (not reading) before its stream is dropped and its "
        "upstream request released")
    keepalive_interval: float = setting(
        15.0, values.positive_float,
        "seconds of silence after which a `: keepalive` SSE comment is sent")
    created_before_upstream: bool = setting(
        False, values.boolean,
        "stream `response.created` and `response.in_progress` as soon as a request is admitted, "
        "not once upstream's answer head is in (about 1 ms sooner); an upstream refusal then "
        "ends the stream with `error` + `response.failed`, not an HTTP error status")
    drain_timeout: float = setting(
        30.0, values.positive_float,
        "on SIGTERM, seconds in-flight streams may take to finish before they are failed")
    drain_linger: float = setting(
        1.0, values.non_negative_float,
        "on SIGTERM, seconds the listener stays open at least (probes and new requests get 503) "
        "even when nothing is in flight; it closes at drain_timeout at the latest")
    render_workers: int = setting(
        1, values.non_negative_int,
        "processes that validate and render /v1/responses requests off the event loop (0: "
        "render on the event loop, the old behaviour)")
    render_timeout: float = setting(
        20.0, values.positive_float,
        "seconds a request may take to render (400 above it, the worker is replaced), and wait "
        "for a free render worker (429 above it)")
    inline_renders_per_tick: int = setting(
        4, values.non_negative_int,
        "cheap requests rendered on a worker's event loop per loop iteration; more wait their "
        "turn, so a burst of new requests does not hold up the frames of open streams (0: no "
        "limit)")
    gc_full_pass_every: int = setting(
        100, values.positive_int,
        "passes of the garbage collector's middle generation between two full passes (CPython's "
        "default: 10); a full pass holds the event loop ~0.5 µs per tracked object, 150-300 ms "
        "with 2,000 open streams, so fewer of them keep frames on time")
    render_queue: int = setting(
        32, values.positive_int,
        "requests that may wait for a render worker at once; more get 429 with Retry-After")
    body_budget_bytes: int = setting(
        64 * 1024 * 1024, values.non_negative_int,
        "request body bytes read and rendered at once, over all requests (0: no budget)")
    body_budget_wait: float = setting(
        5.0, values.non_negative_float,
        "seconds a request waits for room in body_budget_bytes before a 503 with Retry-After")
    max_body_bytes: int = setting(
        16 * 1024 * 1024, values.non_negative_int,
        "largest request body accepted (413 above it)")
    max_prompt_tokens: int = setting(
        131_072, values.positive_int,
        "the model's context in tokens (gpt-oss: 131072): prompt + max_output_tokens above it "
        "is a 400, or with truncation 'auto' the oldest input items are dropped to fit")
    max_concurrent_streams: int = setting(
        0, values.non_negative_int,
        "repaired requests served at once; more get 429 with Retry-After (0: no limit)")
    # The client side's HTTP limits, answered as nginx and Envoy answer them
    # (proxy/server/http/guard.py).
    max_header_bytes: int = setting(
        64 * 1024, values.positive_int,
        "largest request head (request target and header lines) accepted; 431 above it")
    max_headers: int = setting(
        100, values.positive_int, "most header lines a request may have; 431 above it")
    header_timeout: float = setting(
        10.0, values.positive_float,
        "seconds a client may take to send a whole request head (from its first byte, or from "
        "connecting); then 408 and close (slowloris)")
    body_timeout: float = setting(
        30.0, values.positive_float,
        "seconds a request body may pause; after its first body_timeout seconds it must also "
        "average body_min_rate (it is cut at body_timeout + bytes received / body_min_rate); "
        "else 408")
    body_min_rate: int = setting(
        1024, values.non_negative_int,
        "bytes per second a request body must average once it took body_timeout seconds (0: no "
        "minimum)")
    keepalive_timeout: float = setting(
        75.0, values.positive_float,
        "seconds an idle keep-alive client connection stays open (above the 5 s of common "
        "client pools, so the client closes first)")
    max_connections: int = setting(
        2048, values.non_negative_int,
        "open client connections; over it the oldest connection without a whole request head "
        "is closed, else the longest-idle keep-alive one, never one with a request in flight; "
        "with none to close the new connection gets 503 (0: no cap; lowered to fit the "
        "open-file limit)")
    ws_max_message_bytes: int = setting(
        16 * 1024 * 1024, values.positive_int,
        "largest WebSocket message a client may send on GET /v1/responses (the connection is "
        "closed with 1009 above it); also the most unstored history a session keeps for "
        "previous_response_id")
    ws_idle_timeout: float = setting(
        300.0, values.positive_float,
        "seconds a WebSocket session on /v1/responses may stay without a response starting "
        "or ending before it is closed (other messages, refused turns included, do not count)")
    ws_ping_interval: float = setting(
        20.0, values.positive_float,
        "seconds between the proxy's WebSocket pings; a client that answers none within as long "
        "again is closed")
    trusted_proxies: tuple[str, ...] = setting(
        (), values.addresses,
        "comma-separated IPs or CIDR blocks of proxies in front of this one: their "
        "X-Forwarded-For chain is appended to and names the client; from other peers "
        "forwarding headers are replaced")
    passthrough_when_incapable: bool = setting(
        False, values.boolean,
        "when upstream cannot return token ids, pass /v1/responses through unrepaired instead "
        "of answering 502")
    guided_decoding: str = setting(
        "auto", values.choice("auto", "on", "off"),
        "whether upstream enforces response_format (tool_choice and text.format as guided "
        "decoding; trtllm-serve only with guided_decoding_backend set): auto probes it at "
        "start and every 30 s, on/off state it")
    unenforced_constraints: str = setting(
        "refuse", values.choice("refuse", "best_effort"),
        "a request with tool_choice none/required/named/allowed_tools or text.format "
        "json_schema/json_object when upstream does not enforce response_format: refuse (400 "
        "constraint_not_enforced), or best_effort (generate, check the output, and end a "
        "response that breaks the constraint failed, constraint_violated)")
    delta_mode: str = setting(
        "coalesce", values.choice("coalesce", "per_token"),
        "coalesce: one delta event per item per upstream frame; per_token: one per token")
    metrics_models: tuple[str, ...] = setting(
        (), values.names,
        "model names allowed as metric label values (others are counted as 'other')")
    event_loop: str = setting(
        "auto", values.choice("auto", "uvloop", "asyncio"),
        "auto: uvloop when installed (it is in the pinned set), else asyncio's own loop")
    log_level: str = setting(
        "info", values.choice("debug", "info", "warning", "error"), "log level")
    log_format: str = setting(
        "json", values.choice("json", "text"), "one JSON object per line, or text")
    log_content: bool = setting(
        False, values.boolean, "debug only: log prompts and outputs (never enable in production)")
    otel_traces_endpoint: str | None = setting(
        None, values.url,
        "OTLP endpoint OpenTelemetry traces are exported to (http/protobuf: the full "
        "/v1/traces URL; grpc: the collector's address); unset: OTEL_EXPORTER_OTLP_TRACES_"
        "ENDPOINT, else OTEL_EXPORTER_OTLP_ENDPOINT; none of them set: tracing is off",
        example="http://127.0.0.1:4318/v1/traces")
    otel_protocol: str | None = setting(
        None, values.choice("http/protobuf", "grpc"),
        "OTLP protocol of the traces; unset: OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL, else "
        "http/protobuf", example="grpc")
    otel_sample_ratio: float | None = setting(
        None, values.fraction,
        "share of new traces recorded, 0 to 1 (a client's sampled flag is followed); unset: "
        "OTEL_TRACES_SAMPLER[_ARG], else every trace", example=0.1)
    otel_service_name: str | None = setting(
        None, str, "service.name of the traces; unset: OTEL_SERVICE_NAME, else "
        "responses-repair-proxy", example="responses-repair-proxy")
    otel_capture_content: bool = setting(
        False, values.boolean,
        "put prompts and outputs on spans (the GenAI opt-in, also "
        "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true); debug only")
    reasoning_keys: tuple[tuple[str, bytes], ...] = setting(
        (), parse_keys,
        "AES-256-GCM keys for include reasoning.encrypted_content and compaction items, "
        "ID:BASE64 comma-separated, "
        "newest first (it seals, all open: rotate by prepending); unset: one random key per "
        "process, so blobs do not survive a restart or cross replicas",
        secret=True, example="2026-01:ZXhhbXBsZS1rZXktbmV2ZXItdXNlLWluLXByb2R1Y3Q=",
        note="A secret: prefer the environment (a Kubernetes Secret) to this file. Make a key "
        "with `openssl rand -base64 32`; never use the example below.")

    store_url: str = setting(
        "embedded", check_store_url,
        "where responses and conversations are stored: embedded (SQLite in data_dir, shared by "
        "the processes of one host), redis://HOST:PORT/DB (replicas), memory:// (tests), or off")
    data_dir: str = setting(
        "data", str, "directory of the embedded store (a volume in the deploy files)")
    store_ttl: float = setting(
        30 * 24 * 3600.0, values.positive_float,
        "seconds a stored response is kept (OpenAI keeps them 30 days)")
    store_max_bytes: int = setting(
        1024**3, values.non_negative_int,
        "bytes the store may hold; past it the oldest responses are evicted (0: no bound)")
    store_scope_header: str = setting(
        "authorization", values.header_name,
        "request header whose value (hashed) scopes stored responses: a response is visible "
        "only to requests with the same value (Authorization: its bearer token)")
    store_timeout: float = setting(
        5.0, values.positive_float,
        "seconds a request waits for the store before answering 503 (a foreground stream never "
        "waits longer than this for its last write, and never fails for it)")
    # Hosted MCP tools (docs/mcp.md): the proxy connects to the servers requests name.
    mcp_allowed_servers: tuple[str, ...] = setting(
        (), values.names,
        "comma-separated MCP server URL prefixes (https://mcp.example.com/api) or host names a "
        "request's `mcp` tool may name; unset: none (an `mcp` tool is a 400)",
        example="https://mcp.example.com/")
    mcp_allow_private_addresses: bool = setting(
        False, values.boolean,
        "let an allowed MCP server resolve to loopback, link-local or private addresses (a "
        "server beside the proxy); off: such a server is a 400, checked after DNS resolution")
    mcp_max_servers: int = setting(
        16, values.positive_int,
        "`mcp` tools one request may declare (more is a 400 naming the first one past it); "
        "their servers are listed concurrently before the first pass")
    mcp_call_timeout: float = setting(
        30.0, values.positive_float,
        "seconds one MCP operation (connect and list tools, or connect and call a tool) may "
        "take; past it a call is an mcp_call with an error")
    mcp_result_max_chars: int = setting(
        65536, values.positive_int,
        "characters of an MCP tool's result kept (the rest is cut, with a note)")
    mcp_list_cache_seconds: float = setting(
        300.0, values.non_negative_float,
        "seconds a server's tool list is reused, per server URL and credential (0: list on "
        "every request)")
    mcp_max_calls: int = setting(
        8, values.positive_int,
        "MCP tool calls one response may run (a request's max_tool_calls may lower it); once "
        "run, the MCP tools are withdrawn and the model answers")
    mcp_loop_timeout: float = setting(
        300.0, values.positive_float,
        "seconds one response may spend in MCP tool calls and the generation passes between "
        "them; past it no call runs, the MCP tools are withdrawn and the model answers")
    simulator_stream_interval: int = setting(
        20, values.positive_int,
        "built-in simulator: tokens per engine output after the first (trtllm stream_interval)")
    simulator_token_seconds: float = setting(
        0.01, values.non_negative_float, "built-in simulator: seconds per generated token")
    simulator_guided_decoding: bool = setting(
        True, values.boolean,
        "built-in simulator: enforce response_format, as trtllm-serve with a guided-decoding "
        "backend does (false: accept and ignore it, as a stock trtllm-serve does)")

    def repairs(self, model: str) -> bool:
        """Whether `/v1/responses` for `model` goes through the repair."""
        return any(fnmatch.fnmatchcase(model, glob) for glob in self.repair_models)
# fmt: on
