"""Sealed reasoning: `include: ["reasoning.encrypted_content"]` for stateless clients.

A client that keeps no state on the server (Codex with `store: false`) carries the model's
reasoning to its next turn as the reasoning item's `encrypted_content`, which only the server can
read. Here that blob is the reasoning text sealed with AES-256-GCM (`cryptography`'s `AESGCM`,
an authenticated cipher: a changed byte fails to open) under one of the operator's keys:

    blob = urlsafe-base64( 0x02 | kind | len(key id) | key id | 12-byte nonce | ciphertext + tag )

with the version byte, the kind byte and the key id bound in as associated data. The kind
(`REASONING` or `COMPACTION`) says what the blob holds, so a reasoning blob sent back as a
compaction item's `encrypted_content` (or the reverse) does not open. Blobs of version 1 (no kind
byte, sealed before compactions existed) still open, as reasoning only. The newest key (the
first of the setting) seals; every key listed opens, so keys rotate by putting a new one first
and keeping the old ones while their blobs are still in clients' hands. A blob that is not
ours — tampered, cut, sealed under a key no longer listed, or OpenAI's own — does not open: the
request is a 400.

The payload is the reasoning's text parts as JSON (`["…"]`), so an opened item renders exactly
as the plain item with those `reasoning_text` parts renders (request/items.py). Sans-IO: the
shell hands `ReasoningKeys.seal` to the core through `ResponseContext`. `cryptography` is
imported by the first seal or open, not with this module (~5 MB of every process that loads it,
bench/idle_memory.py); a generated key is 32 bytes of `os.urandom`, as `AESGCM.generate_key`'s.
A compaction's payload is its own JSON object (request/compaction.py), sealed with
`seal_json` / opened with `open_json`.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

_VERSION_1 = 1  # reasoning only, no kind byte: still opened
_VERSION = 2
#: What a blob holds (its kind byte).
REASONING = 1
COMPACTION = 2
_NONCE_BYTES = 12
KEY_BYTES = 32  # AES-256


class SealError(ValueError):
    """A blob that does not open with any of our keys (the message says why, never the blob)."""


@dataclass(frozen=True, slots=True)
class ReasoningKeys:
    """The keys reasoning is sealed with, newest first: `(key id, 32 key bytes)` pairs.

    Plain data (picklable), so a worker process can open blobs with it too.
    """

    keys: tuple[tuple[str, bytes], ...]

    def __post_init__(self) -> None:
        if not self.keys:
            raise ValueError("at least one key is needed")
        for key_id, key in self.keys:
            check_key(key_id, key)
        if len({key_id for key_id, _ in self.keys}) != len(self.keys):
            raise ValueError("key ids must be distinct")

    def __repr__(self) -> str:  # never the key bytes, wherever this object is printed
        return f"ReasoningKeys(ids={[key_id for key_id, _ in self.keys]})"

    @classmethod
    def generate(cls, key_id: str = "generated") -> ReasoningKeys:
        """One random key (for a proxy started without configured keys)."""
        return cls(((key_id, os.urandom(KEY_BYTES)),))

    def seal(self, texts: Sequence[str]) -> str:
        """The blob of these reasoning text parts, sealed under the newest key."""
        return self.seal_json(REASONING, list(texts))

    def open(self, blob: str) -> list[str]:
        """The reasoning text parts of a blob we sealed; `SealError` for anything else."""
        texts = self.open_json(REASONING, blob)
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            raise SealError("its content is not reasoning text")  # pragma: no cover - ours
        return texts

    def seal_json(self, kind: int, payload: Any) -> str:
        """The blob of a JSON-able payload of this kind, sealed under the newest key."""
        key_id, key = self.keys[0]
        header = bytes([_VERSION, kind, len(key_id.encode())]) + key_id.encode()
        nonce = os.urandom(_NONCE_BYTES)
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        sealed = AESGCM(key).encrypt(nonce, orjson.dumps(payload), header)
        return base64.urlsafe_b64encode(header + nonce + sealed).decode()

    def open_json(self, kind: int, blob: str) -> Any:
        """The payload of a blob of this kind we sealed; `SealError` for anything else (another
        kind included)."""
        try:
            raw = base64.urlsafe_b64decode(blob.encode("ascii"))
        except (binascii.Error, UnicodeEncodeError, ValueError) as exc:
            raise SealError("it is not base64") from exc
        if len(raw) >= 2 and raw[0] == _VERSION_1 and kind == REASONING:
            id_at = 1  # 0x01 | len | id: the reasoning blobs sealed before the kind byte
        elif len(raw) >= 3 and raw[0] == _VERSION:
            if raw[1] != kind:
                raise SealError("it was sealed for another kind of item")
            id_at = 2
        else:
            raise SealError("it was not sealed by this proxy")
        id_end = id_at + 1 + raw[id_at]
        header, rest = raw[:id_end], raw[id_end:]
        key_id = header[id_at + 1 :].decode("utf-8", "replace")
        key = dict(self.keys).get(key_id)
        if key is None or len(rest) < _NONCE_BYTES + 16:
            raise SealError("it was not sealed with any key this proxy holds")
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        try:
            plain = AESGCM(key).decrypt(rest[:_NONCE_BYTES], rest[_NONCE_BYTES:], header)
        except InvalidTag as exc:
            raise SealError("it does not verify: altered, or not sealed by this proxy") from exc
        return orjson.loads(plain)


def check_key(key_id: str, key: bytes) -> None:
    """Raise `ValueError` unless `key_id` and `key` can seal (the message names no key bytes)."""
    if not key_id or len(key_id.encode()) > 255 or any(c in key_id for c in ",:"):
        raise ValueError("a key id must be 1-255 bytes without ',' or ':'")
    if len(key) != KEY_BYTES:
        raise ValueError(f"key {key_id!r} must be {KEY_BYTES} bytes (base64 of them)")


def parse_keys(value: str) -> tuple[tuple[str, bytes], ...]:
    """`ID:BASE64[,ID:BASE64…]`, newest first, as the setting holds it; `ValueError` naming the
    key id (never the key) when one is wrong."""
    keys: list[tuple[str, bytes]] = []
    for entry in (part.strip() for part in value.split(",")):
        if not entry:
            continue
        key_id, sep, encoded = entry.partition(":")
        if not sep:
            raise ValueError("each key is ID:BASE64 (e.g. 2026-01:<openssl rand -base64 32>)")
        try:
            key = base64.b64decode(encoded.strip(), altchars=b"-_", validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"key {key_id.strip()!r} is not base64") from exc
        check_key(key_id.strip(), key)
        keys.append((key_id.strip(), key))
    if not keys:
        raise ValueError("list at least one ID:BASE64 key")
    if len({key_id for key_id, _ in keys}) != len(keys):
        raise ValueError("key ids must be distinct")
    return tuple(keys)
