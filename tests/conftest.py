"""Shared fixtures: the Harmony encoding (vocab found or fetched once per session), and a real
redis-server for the store's tests (started once per session, on first use)."""

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
