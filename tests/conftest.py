"""Shared fixtures: the Harmony encoding (vocab found or fetched once per session), a real
redis-server for the store's tests (started once per session, on first use), and a throwaway
working directory for the whole session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai_harmony import HarmonyEncoding

from proxy import vocab
from tests.redis_server import redis_server

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def encoding() -> HarmonyEncoding:
    return vocab.load_encoding(vocab.ensure_vocab(os.environ))


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A throwaway redis-server for the session; tests keep apart by key prefix."""
    with redis_server() as url:
        yield url


@pytest.fixture(scope="session", autouse=True)
def throwaway_working_directory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Run every test from an empty directory: the embedded response store's default
    `data_dir` is relative to the working directory, so apps and `serve` processes started
    without one keep their responses there — never in the repository, never from a past run.
    (Tests find their files from `__file__`; subprocesses import the installed package.)"""
    before = Path.cwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    try:
        yield
    finally:
        os.chdir(before)
