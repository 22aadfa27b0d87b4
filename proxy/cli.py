"""Command line: `responses-repair-proxy <command>` (also `python -m proxy <command>`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from proxy import vocab


def _cmd_vocab(args: argparse.Namespace) -> int:
    try:
        folder = vocab.ensure_vocab(os.environ)
    except vocab.VocabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"Harmony vocab ready: {folder / vocab.VOCAB_FILE}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="responses-repair-proxy",
        description="Correct OpenAI Responses streaming for gpt-oss served by trtllm-serve.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    fetch = commands.add_parser(
        "vocab", help="find or fetch the Harmony vocab (o200k_base.tiktoken), sha256-checked"
    )
    fetch.set_defaults(handler=_cmd_vocab)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.handler(args)
    return result
