"""What the guarded protocol (guard_protocol.py) answers itself instead of handing a request to
the app: a `Refusal` — the status, the OpenAI-style error and the `proxy_http_limits_total` kind
it is counted as — raised from a llhttp callback so that parsing stops there, and `PipelineFull`
for a request queued past `MAX_PIPELINED`."""

from __future__ import annotations

from proxy.errors import ClientError, ProxyError


class Refusal(Exception):
    """A request answered with `error` and `status`, not by the app."""

    def __init__(self, kind: str | None, status: int, error: ProxyError) -> None:
        super().__init__(kind)
        #: The `proxy_http_limits_total` kind; None: not a limit, not counted there.
        self.kind = kind
        self.status = status
        self.error = error


class PipelineFull(Exception):
    """Raised from `on_headers_complete` when `MAX_PIPELINED` requests wait already."""


def head_too_large(limit: int) -> Refusal:
    """A head over `max_header_bytes`."""
    error = ClientError(
        f"the request head exceeds the limit of {limit} bytes",
        status=431,
        code="request_header_fields_too_large",
    )
    return Refusal("head_too_large", 431, error)


def too_many_headers(limit: int) -> Refusal:
    """A head with more than `max_headers` fields."""
    error = ClientError(
        f"the request has more than {limit} header fields",
        status=431,
        code="request_header_fields_too_large",
    )
    return Refusal("too_many_headers", 431, error)


def head_timeout(seconds: float) -> Refusal:
    """Part of a head came, not all of it within `header_timeout`."""
    error = ClientError(
        f"the request head was not received within {seconds:g} s",
        status=408,
        code="request_timeout",
    )
    return Refusal("head_timeout", 408, error)
