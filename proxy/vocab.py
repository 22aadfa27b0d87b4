"""Find or fetch the Harmony vocab (`o200k_base.tiktoken`), sha256-checked, and load the encoding.

openai-harmony reads its BPE ranks from the folder named by `TIKTOKEN_ENCODINGS_BASE`, or downloads
them at first use. Machines running this proxy often have no route to that download (air-gapped
GPU clusters, CI), so the vocab is located in this order:

1. `TIKTOKEN_ENCODINGS_BASE` — the operator's own copy; it must hold a valid file.
2. `PROXY_VOCAB_DIR` — our folder; fetched into when missing.
3. the user cache (`$XDG_CACHE_HOME/responses-repair-proxy/vocab`, else `~/.cache/...`); fetched
   into when missing.

Fetching tries the official URL first, then rebuilds the file from the npm package `js-tiktoken`
1.0.21 (`dist/ranks/o200k_base.cjs`), which reproduces it byte for byte. Either way the file is
accepted only when its sha256 is the one tiktoken expects.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import tarfile
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from openai_harmony import HarmonyEncoding, HarmonyEncodingName, load_harmony_encoding

VOCAB_FILE = "o200k_base.tiktoken"
VOCAB_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
OFFICIAL_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
NPM_TARBALL_URL = "https://registry.npmjs.org/js-tiktoken/-/js-tiktoken-1.0.21.tgz"
NPM_RANKS_MEMBER = "package/dist/ranks/o200k_base.cjs"

Fetcher = Callable[[str, float], bytes]


class VocabError(Exception):
    """The vocab could not be found or fetched; the message says where we looked."""


def _urlopen_fetch(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        data: bytes = response.read()
        return data


def is_valid(path: Path) -> bool:
    """True when `path` exists and has the sha256 tiktoken expects for o200k_base."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest() == VOCAB_SHA256
    except OSError:
        return False


def ranks_from_js_tiktoken(cjs_source: str) -> bytes:
    """Rebuild `o200k_base.tiktoken` from js-tiktoken's `o200k_base.cjs`.

    Its `bpe_ranks` string holds lines `! <first rank> <b64 token> <b64 token> …`: consecutive
    ranks starting at the first. The tiktoken file is `<b64 token> <rank>` per line, by rank.
    """
    start = cjs_source.index("{")
    end = cjs_source.rindex("}")
    ranks_text = json.loads(cjs_source[start : end + 1])["bpe_ranks"]
    by_rank: dict[int, str] = {}
    for line in ranks_text.split("\n"):
        fields = line.split(" ")
        if len(fields) < 2 or fields[0] != "!":
            continue
        first = int(fields[1])
        for offset, token in enumerate(fields[2:]):
            base64.b64decode(token, validate=True)  # reject a corrupt package early
            by_rank[first + offset] = token
    return "".join(f"{by_rank[rank]} {rank}\n" for rank in sorted(by_rank)).encode()


def _from_npm(fetch: Fetcher, timeout: float) -> bytes:
    tarball = fetch(NPM_TARBALL_URL, timeout)
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as archive:
        member = archive.extractfile(NPM_RANKS_MEMBER)
        if member is None:
            raise VocabError(f"{NPM_TARBALL_URL} has no {NPM_RANKS_MEMBER}")
        return ranks_from_js_tiktoken(member.read().decode())


def fetch_vocab(dest_dir: Path, *, fetch: Fetcher = _urlopen_fetch, timeout: float = 30.0) -> Path:
    """Download the vocab into `dest_dir` (official URL, then the npm rebuild); sha256-checked."""
    attempts: list[str] = []
    sources: list[tuple[str, Callable[[], bytes]]] = [
        (OFFICIAL_URL, lambda: fetch(OFFICIAL_URL, min(timeout, 10.0))),
        (NPM_TARBALL_URL, lambda: _from_npm(fetch, timeout)),
    ]
    for name, get in sources:
        try:
            data = get()
        except (OSError, ValueError, tarfile.TarError, KeyError, VocabError) as exc:
            attempts.append(f"{name}: {exc}")
            continue
        digest = hashlib.sha256(data).hexdigest()
        if digest != VOCAB_SHA256:
            attempts.append(f"{name}: sha256 {digest} is not {VOCAB_SHA256}")
            continue
        dest_dir.mkdir(parents=True, exist_ok=True)
        target = dest_dir / VOCAB_FILE
        partial = target.with_suffix(f".partial-{os.getpid()}")
        partial.write_bytes(data)
        partial.replace(target)  # atomic: a concurrent reader never sees half a file
        return target
    raise VocabError("could not fetch the Harmony vocab: " + "; ".join(attempts))


def default_cache_dir(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".cache")
    return Path(base) / "responses-repair-proxy" / "vocab"


def ensure_vocab(env: Mapping[str, str], *, fetch: Fetcher = _urlopen_fetch) -> Path:
    """Return the folder holding a valid vocab, fetching it when allowed (see module doc)."""
    explicit = env.get("TIKTOKEN_ENCODINGS_BASE")
    if explicit:
        if is_valid(Path(explicit) / VOCAB_FILE):
            return Path(explicit)
        raise VocabError(
            f"TIKTOKEN_ENCODINGS_BASE={explicit!r} holds no {VOCAB_FILE} with sha256 {VOCAB_SHA256}"
        )
    folder = Path(env["PROXY_VOCAB_DIR"]) if env.get("PROXY_VOCAB_DIR") else default_cache_dir(env)
    if not is_valid(folder / VOCAB_FILE):
        fetch_vocab(folder, fetch=fetch)
    return folder


def loaded_dir(env: Mapping[str, str]) -> Path:
    """The folder `load_encoding` loaded the vocab from (render workers load it from there)."""
    folder = env.get("TIKTOKEN_ENCODINGS_BASE")
    if not folder:
        raise VocabError("no Harmony vocab loaded yet (TIKTOKEN_ENCODINGS_BASE is unset)")
    return Path(folder)


def use_dir(vocab_dir: Path) -> None:
    """Make `vocab_dir` the folder every later load reads (this process's and its children's:
    `loaded_dir`), without loading anything yet."""
    # openai-harmony takes the folder only from this variable; set it before its first load.
    os.environ["TIKTOKEN_ENCODINGS_BASE"] = str(vocab_dir)


def load_encoding(vocab_dir: Path) -> HarmonyEncoding:
    """Load gpt-oss's Harmony encoding from `vocab_dir` (the folder `ensure_vocab` returned)."""
    use_dir(vocab_dir)
    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
