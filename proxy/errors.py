"""The proxy's exception tree, translated to OpenAI-style JSON errors at the HTTP boundary.

    ProxyError                      base; never raised itself
    ├── ClientError                 the request is wrong: 4xx, nothing sent upstream
    ├── UpstreamError               upstream failed before the client's stream started: 502/504/4xx
    ├── UnavailableError            the proxy cannot take the request now (draining, body
    │                               budget full): 503 + Retry-After
    └── StoreUnavailableError       the response store cannot answer now: 503

Errors after a stream started are not exceptions but events (`error` + `response.failed`, built
by the core), because the HTTP status has already been sent.
"""

from __future__ import annotations

from typing import Any

#: The most of a message / `param` an error body carries: the last bound on quoted client input
#: (the request readers quote at most ~200 characters of a value or key).
MESSAGE_CHARS = 1000
PARAM_CHARS = 200


class ProxyError(Exception):
    """Base of the errors the proxy turns into an HTTP error response."""

    status: int = 500
    error_type: str = "server_error"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.param = param
        self.code = code

    def to_body(self) -> dict[str, Any]:
        """The OpenAI error body: `{"error": {"message", "type", "param", "code"}}`."""
        message, param = self.message, self.param
        if len(message) > MESSAGE_CHARS:
            message = message[:MESSAGE_CHARS] + "…"
        if param is not None and len(param) > PARAM_CHARS:
            param = param[:PARAM_CHARS] + "…"
        return {
            "error": {
                "message": message,
                "type": self.error_type,
                "param": param,
                "code": self.code,
            }
        }


class ClientError(ProxyError):
    """The client's request cannot be served as sent (400 unless said otherwise)."""

    status = 400
    error_type = "invalid_request_error"


class UpstreamError(ProxyError):
    """trtllm-serve failed, answered garbage, or timed out before the first byte (502)."""

    status = 502
    error_type = "upstream_error"


class UnavailableError(ProxyError):
    """The proxy cannot take the request now — it is shutting down, or its body budget is
    full: 503 with Retry-After, so the client retries (on another replica)."""

    status = 503
    error_type = "server_error"


class StoreUnavailableError(ProxyError):
    """The response store did not answer (unreachable, failing, too slow): 503, retry later."""

    status = 503
    error_type = "server_error"

    def __init__(self, message: str) -> None:
        super().__init__(message, code="store_unavailable")
