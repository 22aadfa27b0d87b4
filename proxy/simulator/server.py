"""Serving the simulator: in-process on a loopback port (`start_simulator`), or as a command
(`main`, behind `responses-repair-proxy simulate` and `python -m proxy.simulator`).

`start_simulator` runs a real uvicorn server as a task of the current event loop — real sockets,
real chunked bodies, real disconnects, which in-memory transports do not give — on a socket it
binds itself (port 0: an ephemeral port). It installs no signal handlers: the program that
embeds it (the proxy's `serve`, a test) owns them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from openai_harmony import HarmonyEncoding
from starlette.applications import Starlette

from proxy import vocab
from proxy.simulator.app import create_simulator_app
from proxy.simulator.config import SimulatorConfig
from proxy.simulator.options import parse_ids

#: Seconds `stop()` lets open responses finish before their tasks are cancelled.
STOP_GRACE = 1


class _EmbeddedServer(uvicorn.Server):
    """A uvicorn server that leaves signals to its host program."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@dataclass(eq=False)
class RunningSimulator:
    """A simulator serving on `url` (`http://host:port`) until `stop()`."""

    host: str
    port: int
    app: Starlette
    _server: uvicorn.Server
    _task: asyncio.Task[None]

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        """Stop accepting, let open responses end (up to `STOP_GRACE` s), and wait for it."""
        self._server.should_exit = True
        await self._task


async def start_simulator(
    config: SimulatorConfig,
    encoding: HarmonyEncoding,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    app: Starlette | None = None,
) -> RunningSimulator:
    """Start the simulator in the current event loop; returns once it accepts connections.
    `app` defaults to `create_simulator_app(config, encoding)` (pass one to inject seams)."""
    app = app or create_simulator_app(config, encoding)
    sock = _bind(host, port)
    server = _EmbeddedServer(_uvicorn_config(app, log_level="warning", embedded=True))
    task = asyncio.create_task(server.serve(sockets=[sock]), name="trtllm-simulator")
    while not server.started:
        if task.done():
            sock.close()
            task.result()  # startup failed: raise its error
            raise RuntimeError("the simulator stopped during startup")
        await asyncio.sleep(0.005)
    return RunningSimulator(host, sock.getsockname()[1], app, server, task)


def _uvicorn_config(app: Starlette, *, log_level: str, embedded: bool) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        lifespan="off",
        # Embedded, the host program configures logging; as a command, uvicorn's own.
        log_config=None if embedded else uvicorn.config.LOGGING_CONFIG,
        log_level=log_level,
        access_log=not embedded,
        timeout_graceful_shutdown=STOP_GRACE,
    )


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: accepted sockets inherit it, and asyncio turns Nagle off only
    # on sockets whose proto says TCP (`base_events._set_nodelay`) — with 0, every response
    # written in two parts waits ~40 ms for a delayed ACK.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


# -- the command -------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="responses-repair-proxy simulate",
        description="Serve a simulated trtllm-serve (gpt-oss, unpatched /v1/responses) "
        "on a loopback port, without a GPU.",
    )
    defaults = SimulatorConfig()
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    add("--port", type=int, default=8000, help="port to listen on; 0 picks one (default 8000)")
    add("--model", default=defaults.model, help="served model name (default %(default)s)")
    add(
        "--stream-interval",
        type=int,
        default=defaults.stream_interval,
        help="tokens per engine output after the first (default %(default)s)",
    )
    add(
        "--token-seconds",
        type=float,
        default=defaults.token_seconds,
        help="seconds per generated token (default %(default)s)",
    )
    add(
        "--first-token-seconds",
        type=float,
        default=defaults.first_token_seconds,
        help="seconds to the first token (default %(default)s)",
    )
    add(
        "--uneven",
        action="store_true",
        help="speculative-decoding-like outputs of uneven size (seeded by --seed)",
    )
    add("--seed", type=int, default=defaults.seed, help="seed of --uneven (default 0)")
    add(
        "--strip-return",
        action="store_true",
        help="leave the end token <|return|> out of the generated ids",
    )
    add(
        "--fault",
        default=None,
        help="fault spec for every generation request "
        "(see `python -c 'import proxy.simulator; help(proxy.simulator)'`)",
    )
    add(
        "--sim-tokens",
        type=int,
        default=None,
        help="the scripted model writes at least this many tokens",
    )
    add("--preamble", action="store_true", help="the scripted model writes a preamble")
    add(
        "--replay",
        type=Path,
        default=None,
        help="file of token ids (JSON list, or separated by commas/whitespace) to return "
        "instead of the scripted model's",
    )
    add(
        "--postprocess-workers",
        action="store_true",
        help="model postprocess workers (Responses sequence numbers restart)",
    )
    add(
        "--no-completion-logprobs",
        action="store_true",
        help="model a build before early 2026: /v1/completions returns no logprobs",
    )
    add(
        "--no-guided-decoding",
        action="store_true",
        help="model a trtllm-serve without a guided-decoding backend: response_format is "
        "accepted and ignored (the scripted model writes what it forbids)",
    )
    add("--log-level", default="info", help="uvicorn log level (default %(default)s)")
    return parser


def config_from_args(args: argparse.Namespace) -> SimulatorConfig:
    """The config the flags describe (ValueError naming a bad value)."""
    replay = None
    if args.replay is not None:
        replay = parse_ids(args.replay.read_text())
    return SimulatorConfig(
        model=args.model,
        stream_interval=args.stream_interval,
        first_token_seconds=args.first_token_seconds,
        token_seconds=args.token_seconds,
        uneven=args.uneven,
        seed=args.seed,
        return_in_ids=not args.strip_return,
        fault=args.fault,
        sim_tokens=args.sim_tokens,
        preamble=args.preamble,
        replay=replay,
        postprocess_workers=args.postprocess_workers,
        completion_logprobs=not args.no_completion_logprobs,
        guided_decoding=not args.no_guided_decoding,
    )


def main(argv: Sequence[str]) -> int:
    """`simulate [flags]`: serve until interrupted; 0 on a clean stop, 1 on a setup error."""
    args = build_parser().parse_args(list(argv))
    try:
        config = config_from_args(args)
        encoding = vocab.load_encoding(vocab.ensure_vocab(os.environ))
    except (ValueError, OSError, vocab.VocabError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        sock = _bind(args.host, args.port)
    except OSError as exc:
        print(f"error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 1
    app = create_simulator_app(config, encoding)
    server = uvicorn.Server(_uvicorn_config(app, log_level=args.log_level, embedded=False))
    host, port = sock.getsockname()[:2]
    print(f"simulated trtllm-serve ({config.model}) on http://{host}:{port}", file=sys.stderr)
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the SIGINT it stopped on
        server.run(sockets=[sock])
    return 0
