"""Request validation errors the way trtllm-serve's FastAPI/pydantic layer reports them.

Upstream's request models are pydantic v2 models with `extra="forbid"` (`OpenAIBaseModel`);
FastAPI validates a body against its model with `from_attributes=True` and puts `"body"` in
front of each error's location, and upstream's `RequestValidationError` handler answers
`400 {"error": str(exc)}` — the Python `str()` of the error list, e.g. `[{'type':
'extra_forbidden', 'loc': ('body', 'seed'), 'msg': 'Extra inputs are not permitted', 'input':
42}]` (see `tests/fixtures/trtllm-prompts/d25_*.json`). The simulator's models are pydantic
models too (completion_request.py), so types, coercion, messages and the order of errors are
pydantic's own. Errors the handler raises later use the other shape, `{"object": "error",
"message", "type", "param", "code"}` (`OpenAIServer.create_error_response`): `error_body`
builds it. Sans-IO.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

_Model = TypeVar("_Model", bound=BaseModel)


class RequestValidationError(Exception):
    """The body failed validation; `body()` is upstream's 400 answer."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(str(errors))
        self.errors = errors

    def body(self) -> dict[str, Any]:
        return {"error": str(self.errors)}


def validate_body(body: Any, model: type[_Model]) -> _Model:
    """`body` (parsed JSON) as an instance of `model`, or `RequestValidationError` with
    pydantic's errors located as FastAPI locates them."""
    try:
        return model.model_validate(body, from_attributes=True)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise RequestValidationError(
            [{**error, "loc": ("body", *error["loc"])} for error in errors]
        ) from None


def error_body(message: str, status: int, error_type: str = "BadRequestError") -> dict[str, Any]:
    """Upstream's `ErrorResponse` (openai_protocol.py): `code` is the HTTP status."""
    return {
        "object": "error",
        "message": message,
        "type": error_type,
        "param": None,
        "code": status,
    }


def error_type_for(status: int) -> str:
    """The `type` upstream (or a gateway in front of it) gives an error of this status."""
    return {
        400: "BadRequestError",
        404: "InvalidRequestError",
        429: "RateLimitError",
        501: "NotImplementedError",
        503: "ServiceUnavailableError",
    }.get(status, "BadRequestError" if status < 500 else "InternalServerError")


def json_error(detail: str) -> RequestValidationError:
    """FastAPI's answer to a body that is not JSON (FastAPI's own error, before pydantic)."""
    return RequestValidationError(
        [
            {
                "type": "json_invalid",
                "loc": ("body", 0),
                "msg": "JSON decode error",
                "input": {},
                "ctx": {"error": detail},
            }
        ]
    )
