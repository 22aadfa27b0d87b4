"""Raw-socket HTTP/1.1 for the guard tests: requests written byte by byte as a hostile client
would, answers parsed with h11 (a well-kept parser, not ours), pipelined ones included."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import h11
import orjson


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes = b""
    complete: bool = False

    def json(self) -> Any:
        return orjson.loads(self.body)

    def events(self) -> list[dict[str, Any]]:
        return [
            orjson.loads(line[6:])
            for line in self.body.split(b"\n")
            if line.startswith(b"data: ") and line != b"data: [DONE]"
        ]


@dataclass
class Read:
    """Everything a connection received, and whether the server closed it."""

    data: bytes
    closed: bool
    answers: list[Answer] = field(default_factory=list)


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def request(
    method: str,
    target: str,
    body: bytes = b"",
    headers: Sequence[tuple[str, str]] = (),
    *,
    content_type: str = "application/json",
) -> bytes:
    lines = [f"{method} {target} HTTP/1.1", "host: proxy.test"]
    if body or method == "POST":
        lines += [f"content-type: {content_type}", f"content-length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def parse(data: bytes, methods: Sequence[str]) -> list[Answer]:
    """The answers in `data`, one per request method, in order; stops at an incomplete one."""
    answers: list[Answer] = []
    rest = data
    for method in methods:
        if not rest:  # (h11 reads an empty feed as the end of the connection)
            break
        conn = h11.Connection(h11.CLIENT)
        conn.send(h11.Request(method=method, target="/", headers=[("host", "x")]))
        conn.send(h11.EndOfMessage())
        conn.receive_data(rest)
        answer: Answer | None = None
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                break
            if isinstance(event, h11.Response):
                headers = {k.decode(): v.decode("latin-1") for k, v in event.headers}
                answer = Answer(event.status_code, headers)
            elif isinstance(event, h11.Data) and answer is not None:
                answer.body += event.data
            elif isinstance(event, h11.EndOfMessage) and answer is not None:
                answer.complete = True
                break
        if answer is None:
            break
        answers.append(answer)
        if not answer.complete:
            break
        rest = conn.trailing_data[0]
    return answers


def exchange(
    port: int, data: bytes, methods: Sequence[str] = ("GET",), *, timeout: float = 10.0
) -> Read:
    """Write `data` on a new connection and read until every answer is in (and, if the last
    says `connection: close`, until the server closes), the server closes, or `timeout`."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        read = read_all(sock, timeout, methods)
    read.answers = parse(read.data, methods)
    return read


def _answered(data: bytes, methods: Sequence[str]) -> bool:
    answers = parse(data, methods)
    return (
        len(answers) == len(methods)
        and all(a.complete for a in answers)
        and answers[-1].headers.get("connection") != "close"
    )


def read_all(sock: socket.socket, timeout: float, methods: Sequence[str] = ()) -> Read:
    """Read until the server closes, `timeout`, or (given `methods`) every answer is in."""
    deadline = time.monotonic() + timeout
    data = b""
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return Read(data, closed=False)
        except ConnectionResetError:
            return Read(data, closed=True)
        if not chunk:
            return Read(data, closed=True)
        data += chunk
        if methods and _answered(data, methods):
            return Read(data, closed=False)


async def read_async(reader: asyncio.StreamReader, timeout: float) -> Read:
    data = b""
    try:
        async with asyncio.timeout(timeout):
            while chunk := await reader.read(65536):
                data += chunk
    except TimeoutError:
        return Read(data, closed=False)
    except ConnectionResetError:
        return Read(data, closed=True)
    return Read(data, closed=True)


def assert_error(answer: Answer, status: int, code: str) -> None:
    """A complete OpenAI-style JSON error with `code`, the connection's last answer."""
    assert answer.complete, answer
    assert answer.status == status, answer
    assert answer.headers["connection"] == "close"
    assert answer.headers["content-type"] == "application/json"
    error = answer.json()["error"]
    assert error["code"] == code, error
    assert set(error) == {"message", "type", "param", "code"}
