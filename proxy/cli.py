"""Command line: `responses-repair-proxy <command>` (also `python -m proxy <command>`).

serve     run the proxy (with the built-in simulator as upstream when none is configured)
simulate  run the trtllm-serve simulator alone
demo      show, side by side, what a client sees from trtllm-serve and through the proxy
vocab     find or fetch the Harmony vocab
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence

from openai_harmony import HarmonyEncoding

from proxy import config, vocab


def _encoding_or_exit() -> HarmonyEncoding:
    try:
        return vocab.load_encoding(vocab.ensure_vocab(os.environ))
    except vocab.VocabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def _cmd_vocab(args: argparse.Namespace) -> int:
    try:
        folder = vocab.ensure_vocab(os.environ)
    except vocab.VocabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"Harmony vocab ready: {folder / vocab.VOCAB_FILE}")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    from proxy import logs, server

    try:
        settings = config.load_settings(os.environ, args)
    except config.ConfigError as exc:
        print(f"error: bad setting: {exc}", file=sys.stderr)
        return 2
    logger = logs.configure(settings.log_level, settings.log_format)
    encoding = _encoding_or_exit()
    try:
        asyncio.run(server.serve(settings, encoding, logger))
    except KeyboardInterrupt:  # a second Ctrl-C
        return 130
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from proxy.simulator.server import main as simulate

    return simulate(args.rest)


def _cmd_demo(args: argparse.Namespace) -> int:
    from proxy.demo import main as demo

    return demo(args.rest)


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
    config.add_arguments(serve)
    serve.set_defaults(handler=_cmd_serve)
    for name, handler, text in (
        ("simulate", _cmd_simulate, "run the trtllm-serve simulator (see --help)"),
        ("demo", _cmd_demo, "before/after demo with the simulator, no GPU needed (see --help)"),
    ):
        sub = commands.add_parser(name, help=text, add_help=False)
        sub.add_argument("rest", nargs=argparse.REMAINDER)
        sub.set_defaults(handler=handler)
    fetch = commands.add_parser(
        "vocab", help="find or fetch the Harmony vocab (o200k_base.tiktoken), sha256-checked"
    )
    fetch.set_defaults(handler=_cmd_vocab)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.handler(args)
    return result
