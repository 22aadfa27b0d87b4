"""Shared fixtures: the Harmony encoding (vocab found or fetched once per session)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from openai_harmony import HarmonyEncoding

from proxy import vocab

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def encoding() -> HarmonyEncoding:
    return vocab.load_encoding(vocab.ensure_vocab(os.environ))
