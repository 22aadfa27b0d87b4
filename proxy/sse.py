"""Server-sent events, both ways, without I/O.

`encode` writes one Responses event as `event: <type>\\ndata: <compact JSON>\\n\\n`, the
framing OpenAI's stream uses (the type both in the `event:` line and in the JSON, which clients
read; no `data: [DONE]`). JSON escapes every control character, so no text the model writes can
break a frame or inject one.

`SSEDecoder` reads upstream's `/v1/completions` stream incrementally, in the manner of httpx-sse:
`feed(bytes)` returns the complete messages so far; `flush()` the last one when the body ended
without a blank line. Lines end in LF, CRLF or CR; comment lines are dropped; `data:` lines of
one message are joined with LF (the WHATWG algorithm, minus retry/id, which we do not use).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

import orjson

KEEPALIVE = b": keepalive\n\n"


def encode(event: dict[str, Any]) -> bytes:
    """One event as an SSE frame; `event["type"]` names it."""
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def encode_all(events: Iterable[dict[str, Any]]) -> bytes:
    """Several events as one chunk: the events of one upstream frame go out in one send."""
    parts: list[bytes] = []
    dumps = orjson.dumps
    for event in events:  # `encode`, inline: one call per frame on the hot path
        kind: str = event["type"]
        parts += (b"event: ", kind.encode(), b"\ndata: ", dumps(event), b"\n\n")
    return b"".join(parts)


class Message(NamedTuple):
    """One SSE message (a tuple: made once per upstream frame, cheaply)."""

    data: str
    event: str = "message"


class SSEDecoder:
    """Incremental SSE parser over raw body bytes (invalid UTF-8 is replaced, never raised)."""

    __slots__ = ("_buffer", "_data", "_event")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []
        self._event = ""

    def feed(self, chunk: bytes) -> list[Message]:
        self._buffer += chunk
        if b"\r" not in self._buffer:
            # LF line ends only, as trtllm-serve writes them: one split for the whole chunk.
            lines = self._buffer.split(b"\n")
            self._buffer = lines.pop()
            found = [self._line(line.decode("utf-8", "replace")) for line in lines]
            return [message for message in found if message is not None]
        messages: list[Message] = []
        while True:
            cut, skip = _line_end(self._buffer)
            if cut < 0:
                break
            line = self._buffer[:cut].decode("utf-8", "replace")
            self._buffer = self._buffer[cut + skip :]
            message = self._line(line)
            if message is not None:
                messages.append(message)
        return messages

    def flush(self) -> list[Message]:
        """End of body: a pending line and message count as complete."""
        messages = []
        if self._buffer:
            line, self._buffer = self._buffer.decode("utf-8", "replace"), b""
            message = self._line(line)
            if message is not None:
                messages.append(message)
        message = self._line("")
        if message is not None:
            messages.append(message)
        return messages

    @property
    def pending_bytes(self) -> int:
        """Bytes held for an unfinished line (bounded by the caller: a frame-size limit)."""
        return len(self._buffer)

    def _line(self, line: str) -> Message | None:
        if line.startswith("data: "):  # the common line first
            self._data.append(line[6:])
            return None
        if not line:
            if not self._data:
                self._event = ""
                return None
            message = Message("\n".join(self._data), self._event or "message")
            self._data, self._event = [], ""
            return message
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None


def _line_end(buffer: bytes) -> tuple[int, int]:
    """Index of the first line end and its length (CRLF is 2); (-1, 0) when none is complete.

    A CR at the very end may be the first half of a CRLF: wait for the next byte.
    """
    lf = buffer.find(b"\n")
    cr = buffer.find(b"\r", 0, lf if lf >= 0 else len(buffer))
    if cr < 0:
        return lf, 1
    if cr + 1 == len(buffer):
        return -1, 0
    return cr, 2 if buffer[cr + 1 : cr + 2] == b"\n" else 1
