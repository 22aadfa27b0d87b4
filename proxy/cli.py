"""Command line: `responses-repair-proxy <command>` (also `python -m proxy <command>`).

serve     run the proxy (with the built-in simulator as upstream when none is configured)
simulate  run the trtllm-serve simulator alone
demo      show, side by side, what a client sees from trtllm-serve and through the proxy
vocab     find or fetch the Harmony vocab
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from openai_harmony import HarmonyEncoding

from proxy import vocab
from proxy.config import sources
from proxy.config.settings import Settings


def _vocab_or_exit() -> Path:
    try:
        return vocab.ensure_vocab(os.environ)
    except vocab.VocabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def _encoding_or_exit() -> HarmonyEncoding:
    return vocab.load_encoding(_vocab_or_exit())


def _cmd_vocab(args: argparse.Namespace) -> int:
    try:
        folder = vocab.ensure_vocab(os.environ)
    except vocab.VocabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"Harmony vocab ready: {folder / vocab.VOCAB_FILE}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from proxy import logs
    from proxy.server.processes.cpus import resolve_workers

    try:
        settings = sources.load_settings(os.environ, args)
        workers = resolve_workers(settings.workers)
        if workers > 1:
            from proxy.server.processes.worker import check_settings

            check_settings(settings, workers)
        _check_tracing(settings)
    except (sources.ConfigError, ValueError) as exc:
        print(f"error: bad setting: {exc}", file=sys.stderr)
        return 2
    logger = logs.configure(settings.log_level, settings.log_format)
    if workers > 1:
        # The supervisor serves no client: it loads the encoding (~52 MB) only to run the
        # simulator; each worker loads its own from the folder set here.
        folder = _vocab_or_exit()
        vocab.use_dir(folder)
        return _supervise(settings, workers, functools.partial(vocab.load_encoding, folder), logger)
    encoding = _encoding_or_exit()
    from proxy.server.processes import runner as server

    try:
        with asyncio.Runner(loop_factory=server.loop_factory(settings.event_loop)) as runner:
            runner.run(server.serve(settings, encoding, logger))
    except KeyboardInterrupt:  # a second Ctrl-C
        return 130
    return 0


def _check_tracing(settings: Settings) -> None:
    """A traces protocol the proxy cannot export (OTEL_EXPORTER_OTLP_PROTOCOL=http/json) fails
    at start, like a bad setting (ValueError), not in each worker."""
    from proxy.tracing import TraceConfig

    traces = TraceConfig(endpoint=settings.otel_traces_endpoint, protocol=settings.otel_protocol)
    if traces.resolved_endpoint(os.environ) is not None:
        traces.resolved_protocol(os.environ)


def _supervise(
    settings: Settings,
    workers: int,
    encoding: Callable[[], HarmonyEncoding],
    logger: logging.Logger,
) -> int:
    """`serve` with worker processes (proxy/server/processes/supervisor.py)."""
    from proxy.server.processes import multiproc

    # Before anything imports prometheus_client: it reads the directory once, at import.
    metrics_dir, made = multiproc.prepare(os.environ)
    from proxy.server.processes import runner
    from proxy.server.processes.supervisor import Supervisor

    try:
        with asyncio.Runner(loop_factory=runner.loop_factory(settings.event_loop)) as loop:
            return loop.run(Supervisor(settings, workers, encoding, logger, metrics_dir).run())
    finally:
        if made:
            multiproc.remove(metrics_dir)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="responses-repair-proxy",
        description="Correct OpenAI Responses streaming for gpt-oss served by trtllm-serve.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the proxy",
        description="Run the proxy. Every flag also reads PROXY_<NAME> and the config file.",
    )
    sources.add_arguments(serve)
    serve.set_defaults(handler=_cmd_serve)
    # Listed for --help; `main` hands them their arguments before this parser runs.
    commands.add_parser("simulate", help="run the trtllm-serve simulator (see simulate --help)")
    commands.add_parser("demo", help="before/after demo with the simulator, no GPU (demo --help)")
    fetch = commands.add_parser(
        "vocab", help="find or fetch the Harmony vocab (o200k_base.tiktoken), sha256-checked"
    )
    fetch.set_defaults(handler=_cmd_vocab)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `simulate` and `demo` parse their own flags (argparse's REMAINDER would stop at the
    # first option-looking word and mis-read them).
    if argv and argv[0] in ("simulate", "demo"):
        from proxy.demo import main as demo
        from proxy.simulator.server import main as simulate

        return (simulate if argv[0] == "simulate" else demo)(argv[1:])
    args = build_parser().parse_args(argv)
    result: int = args.handler(args)
    return result
