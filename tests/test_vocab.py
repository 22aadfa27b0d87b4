"""Finding and fetching the Harmony vocab: sources, order, and the sha256 gate."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest

from proxy import vocab


@pytest.fixture(scope="module")
def real_vocab() -> bytes:
    return (vocab.ensure_vocab(os.environ) / vocab.VOCAB_FILE).read_bytes()


def _npm_tarball(real: bytes) -> bytes:
    """A js-tiktoken-shaped package whose ranks rebuild `real` (lines `! <rank> <tok>…`)."""
    lines = real.decode().splitlines()
    groups = []
    for start in range(0, len(lines), 1000):
        chunk = [line.split(" ")[0] for line in lines[start : start + 1000]]
        groups.append("! " + str(start) + " " + " ".join(chunk))
    source = (
        'module.exports = {"pat_str":"x","special_tokens":{},"bpe_ranks":'
        + '"'
        + "\\n".join(groups)
        + '"};'
    )
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        data = source.encode()
        info = tarfile.TarInfo(vocab.NPM_RANKS_MEMBER)
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_rebuild_from_js_tiktoken_is_byte_identical(tmp_path: Path, real_vocab: bytes) -> None:
    assert hashlib.sha256(real_vocab).hexdigest() == vocab.VOCAB_SHA256
    tarball = _npm_tarball(real_vocab)
    calls: list[str] = []

    def fetch(url: str, timeout: float) -> bytes:
        calls.append(url)
        if url == vocab.OFFICIAL_URL:
            raise OSError("no route to host")  # the air-gapped case
        assert url == vocab.NPM_TARBALL_URL
        return tarball

    return_path = vocab.fetch_vocab(tmp_path, fetch=fetch)
    assert calls == [vocab.OFFICIAL_URL, vocab.NPM_TARBALL_URL]
    assert return_path.read_bytes() == real_vocab


def test_official_download_is_used_when_reachable(tmp_path: Path, real_vocab: bytes) -> None:
    path = vocab.fetch_vocab(tmp_path, fetch=lambda url, timeout: real_vocab)
    assert vocab.is_valid(path)


def test_wrong_checksum_is_refused(tmp_path: Path) -> None:
    with pytest.raises(vocab.VocabError, match="sha256") as info:
        vocab.fetch_vocab(tmp_path, fetch=lambda url, timeout: b"tampered")
    assert "npm" in str(info.value) or "js-tiktoken" in str(info.value)
    assert not (tmp_path / vocab.VOCAB_FILE).exists()


def test_search_order(tmp_path: Path, real_vocab: bytes) -> None:
    good = tmp_path / "good"
    good.mkdir()
    (good / vocab.VOCAB_FILE).write_bytes(real_vocab)
    assert vocab.ensure_vocab({"TIKTOKEN_ENCODINGS_BASE": str(good)}) == good
    with pytest.raises(vocab.VocabError, match="TIKTOKEN_ENCODINGS_BASE"):
        vocab.ensure_vocab({"TIKTOKEN_ENCODINGS_BASE": str(tmp_path / "empty")})
    fetched: list[str] = []

    def fetch(url: str, timeout: float) -> bytes:
        fetched.append(url)
        return real_vocab

    mine = tmp_path / "mine"
    assert vocab.ensure_vocab({"PROXY_VOCAB_DIR": str(mine)}, fetch=fetch) == mine
    assert fetched == [vocab.OFFICIAL_URL]
    assert vocab.ensure_vocab({"PROXY_VOCAB_DIR": str(mine)}, fetch=fetch) == mine
    assert len(fetched) == 1, "a valid cached copy is not fetched again"
    cache = vocab.ensure_vocab({"XDG_CACHE_HOME": str(tmp_path / "xdg")}, fetch=fetch)
    assert cache == tmp_path / "xdg" / "responses-repair-proxy" / "vocab"
