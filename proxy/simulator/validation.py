"""Request validation the way trtllm-serve's FastAPI/pydantic layer does it, without pydantic.

Upstream's request models are pydantic v2 models with `extra="forbid"` (`OpenAIBaseModel`), and
its `RequestValidationError` handler answers `400 {"error": str(exc)}` — the Python `str()` of
the error list, e.g. `[{'type': 'extra_forbidden', 'loc': ('body', 'seed'), 'msg': 'Extra inputs
are not permitted', 'input': 42}]` (see `tests/fixtures/trtllm-prompts/d25_*.json`). Errors the
handler raises later use the other shape, `{"object": "error", "message", "type", "param",
"code"}` (`OpenAIServer.create_error_response`): `error_body` builds it.

The validators below coerce like pydantic's lax mode (a bool or an integral float is an int, a
numeric string is a number, "yes"/"no"/0/1 are booleans, nothing but a string is a string) and
report pydantic's error types and messages; union errors are reported per member as pydantic
does. Sans-IO.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

Loc = tuple[str | int, ...]
Validator = Callable[[Any, Loc, list[dict[str, Any]]], Any]

_TRUE = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE = frozenset({"0", "off", "f", "false", "n", "no"})
_MISSING = object()


class RequestValidationError(Exception):
    """The body failed validation; `body()` is upstream's 400 answer."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(str(errors))
        self.errors = errors

    def body(self) -> dict[str, Any]:
        return {"error": str(self.errors)}


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


def _error(
    errors: list[dict[str, Any]], kind: str, loc: Loc, msg: str, value: Any, **ctx: Any
) -> None:
    error: dict[str, Any] = {"type": kind, "loc": loc, "msg": msg, "input": value}
    if ctx:
        error["ctx"] = ctx
    errors.append(error)


# -- primitives ------------------------------------------------------------------------------


def v_str(value: Any, loc: Loc, errors: list[dict[str, Any]]) -> Any:
    if isinstance(value, str):
        return value
    _error(errors, "string_type", loc, "Input should be a valid string", value)
    return None


def v_int(value: Any, loc: Loc, errors: list[dict[str, Any]]) -> Any:
    if isinstance(value, bool | int):
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value) and value.is_integer():
            return int(value)
        msg = "Input should be a valid integer, got a number with a fractional part"
        _error(errors, "int_from_float", loc, msg, value)
        return None
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            msg = "Input should be a valid integer, unable to parse string as an integer"
            _error(errors, "int_parsing", loc, msg, value)
            return None
    _error(errors, "int_type", loc, "Input should be a valid integer", value)
    return None


def v_float(value: Any, loc: Loc, errors: list[dict[str, Any]]) -> Any:
    if isinstance(value, bool | int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            msg = "Input should be a valid number, unable to parse string as a number"
            _error(errors, "float_parsing", loc, msg, value)
            return None
    _error(errors, "float_type", loc, "Input should be a valid number", value)
    return None


def v_bool(value: Any, loc: Loc, errors: list[dict[str, Any]]) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    if isinstance(value, int | float | str):
        msg = "Input should be a valid boolean, unable to interpret input"
        _error(errors, "bool_parsing", loc, msg, value)
    else:
        _error(errors, "bool_type", loc, "Input should be a valid boolean", value)
    return None


def v_any_dict(value: Any, loc: Loc, errors: list[dict[str, Any]]) -> Any:
    if isinstance(value, dict):
        return value
    _error(errors, "dict_type", loc, "Input should be a valid dictionary", value)
    return None


# -- combinators -----------------------------------------------------------------------------


def optional(inner: Validator) -> Validator:
    def check(value: Any, loc: Loc, errors: list[dict[str, Any]]) -> Any:
        return None if value is None else inner(value, loc, errors)

    return check


def list_of(inner: Validator) -> Validator:
    def check(value: Any, loc: Loc, errors: list[dict[str, Any]]) -> Any:
        if not isinstance(value, list):
            _error(errors, "list_type", loc, "Input should be a valid list", value)
            return None
        return [inner(item, (*loc, index), errors) for index, item in enumerate(value)]

    return check


def dict_of(inner: Validator) -> Validator:
    def check(value: Any, loc: Loc, errors: list[dict[str, Any]]) -> Any:
        if not isinstance(value, dict):
            _error(errors, "dict_type", loc, "Input should be a valid dictionary", value)
            return None
        return {key: inner(item, (*loc, key), errors) for key, item in value.items()}

    return check


def literal(*values: str) -> Validator:
    expected = " or ".join(repr(v) for v in values)

    def check(value: Any, loc: Loc, errors: list[dict[str, Any]]) -> Any:
        if value in values and isinstance(value, str):
            return value
        _error(
            errors, "literal_error", loc, f"Input should be {expected}", value, expected=expected
        )
        return None

    return check


def union(*members: tuple[str, Validator]) -> Validator:
    """The first member that validates wins; else every member's errors, each under its name."""

    def check(value: Any, loc: Loc, errors: list[dict[str, Any]]) -> Any:
        collected: list[dict[str, Any]] = []
        for name, member in members:
            attempt: list[dict[str, Any]] = []
            result = member(value, (*loc, name), attempt)
            if not attempt:
                return result
            collected += attempt
        errors += collected
        return None

    return check


def bounded(inner: Validator, *, ge: float | None = None, le: float | None = None) -> Validator:
    def check(value: Any, loc: Loc, errors: list[dict[str, Any]]) -> Any:
        result = inner(value, loc, errors)
        if result is None:
            return None
        if ge is not None and result < ge:
            msg = f"Input should be greater than or equal to {ge:g}"
            _error(errors, "greater_than_equal", loc, msg, value, ge=ge)
        elif le is not None and result > le:
            msg = f"Input should be less than or equal to {le:g}"
            _error(errors, "less_than_equal", loc, msg, value, le=le)
        return result

    return check


@dataclass(frozen=True, slots=True)
class Field:
    """A model field: its validator and default (`_MISSING`: required)."""

    check: Validator
    default: Any = _MISSING


def model(name: str, fields: Mapping[str, Field]) -> Validator:
    """An `extra="forbid"` model: unknown keys, missing required keys and field errors."""

    def check(value: Any, loc: Loc, errors: list[dict[str, Any]]) -> Any:
        if not isinstance(value, dict):
            msg = f"Input should be a valid dictionary or instance of {name}"
            _error(errors, "model_type", loc, msg, value, class_name=name)
            return None
        result: dict[str, Any] = {}
        for key, spec in fields.items():
            if key in value:
                result[key] = spec.check(value[key], (*loc, key), errors)
            elif spec.default is _MISSING:
                _error(errors, "missing", (*loc, key), "Field required", value)
            else:
                result[key] = spec.default
        for key, item in value.items():
            if key not in fields:
                _error(
                    errors, "extra_forbidden", (*loc, key), "Extra inputs are not permitted", item
                )
        return result

    return check


def validate_body(body: Any, validator: Validator) -> dict[str, Any]:
    """Validate a parsed JSON body at loc `('body', …)` or raise `RequestValidationError`."""
    errors: list[dict[str, Any]] = []
    if not isinstance(body, dict):
        msg = "Input should be a valid dictionary or object to extract fields from"
        raise RequestValidationError(
            [{"type": "model_attributes_type", "loc": ("body",), "msg": msg, "input": body}]
        )
    result = validator(body, ("body",), errors)
    if errors:
        raise RequestValidationError(errors)
    assert isinstance(result, dict)
    return result


def value_error(body: Any, message: str) -> RequestValidationError:
    """What a `mode="before"` model validator raising ValueError(message) gives."""
    return RequestValidationError(
        [
            {
                "type": "value_error",
                "loc": ("body",),
                "msg": f"Value error, {message}",
                "input": body,
                "ctx": {"error": ValueError(message)},
            }
        ]
    )


def json_error(detail: str) -> RequestValidationError:
    """FastAPI's answer to a body that is not JSON."""
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
