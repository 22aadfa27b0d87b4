"""Typed reads of a parsed `/v1/responses` body: each returns the value or raises `ClientError`.

The request side must be total: whatever JSON a client sends, the only exception that
leaves `prepare_request` is `ClientError` with a 4xx status. These readers are the one place that
turns a wrong value into that error, so every message has the same shape: the field path as
OpenAI's `param` (`input[2].content[0].type`), the value (shortened), and what was expected.

`check_shape` walks the objects inside a body with the table of their keys (request/shapes.py):
an unknown key anywhere is a 400 naming its path, as an unknown top-level field is.

`check_json` runs once over the whole body first. Everything after it may assume plain JSON:
`dict` with `str` keys, `list`, valid-UTF-8 `str`, `bool`, `None`, 64-bit `int`, finite `float`,
nested at most `MAX_DEPTH` deep. That is what orjson (our encoder) and openai-harmony (whose
Rust side parses the conversation as JSON, recursion limit 128) accept, so neither can fail later
on a value the client chose.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, NoReturn

from proxy.errors import ClientError

#: Deepest nesting accepted anywhere in a body. Tool parameter schemas end up ~10 levels further
#: down inside the conversation JSON openai-harmony parses (serde_json's limit is 128).
MAX_DEPTH = 100

_INT_MIN = -(2**63)  # orjson encodes signed and unsigned 64-bit integers, nothing wider
_INT_MAX = 2**64 - 1
_SHOWN_CHARS = 60
#: Longest field path quoted in a message or `param`, so a client's 2 MB unknown key does not come
#: back whole in the 400 body.
_SHOWN_PATH = 200


def describe(value: Any) -> str:
    """A short, always-safe rendering of `value` for an error message (never raises)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        shown = value if len(value) <= _SHOWN_CHARS else value[:_SHOWN_CHARS] + "…"
        return repr(shown.encode("utf-8", "backslashreplace").decode("utf-8"))
    if isinstance(value, int):
        return str(value) if abs(value) < 10**30 else "a very large integer"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return f"a {type(value).__name__}"


def shown(path: str) -> str:
    """`path` as quoted in an error: at most `_SHOWN_PATH` characters of it."""
    return path if len(path) <= _SHOWN_PATH else path[:_SHOWN_PATH] + "…"


def fail(path: str, value: Any, problem: str, *, code: str = "invalid_value") -> NoReturn:
    """Raise the 400 for `path` holding `value`: `'<path>' is <value>: <problem>`."""
    path = shown(path)
    raise ClientError(f"'{path}' is {describe(value)}: {problem}", param=path, code=code)


def missing(path: str) -> NoReturn:
    """Raise the 400 for a required field that is absent (or null)."""
    path = shown(path)
    raise ClientError(
        f"Missing required parameter: '{path}'.", param=path, code="missing_required_parameter"
    )


def at(path: str, key: str | int) -> str:
    """A member's path: `at("input", 2)` is `input[2]`, `at("text", "format")` `text.format`."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def check_json(value: Any, path: str, depth: int = 0) -> None:
    """Raise unless `value` is plain JSON that orjson and openai-harmony accept (module doc)."""
    if depth > MAX_DEPTH:
        fail(path, value, f"nested deeper than {MAX_DEPTH} levels", code="invalid_value")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                fail(path, value, "not valid Unicode text (unpaired surrogate)")
        return
    if isinstance(value, int):
        if not _INT_MIN <= value <= _INT_MAX:
            fail(path, value, "integer out of the 64-bit range")
        return
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            fail(path, value, "not a finite number")
        return
    if isinstance(value, list):
        for index, item in enumerate(value):
            check_json(item, at(path, index), depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                fail(path, key, "object keys must be strings", code="invalid_type")
            check_json(key, path, depth + 1)
            check_json(item, at(path, key), depth + 1)
        return
    fail(path, value, "not a JSON value", code="invalid_type")


def present(obj: Mapping[str, Any], key: str) -> Any:
    """`obj[key]`, or None when absent: an explicit null means "unset", as on the OpenAI wire."""
    return obj.get(key)


def check_keys(obj: Mapping[str, Any], allowed: Collection[str], path: str, what: str) -> None:
    """Reject the first key of `obj` outside `allowed` (e.g. the chat-completions `seed`)."""
    for key in obj:
        if key not in allowed:
            where = shown(at(path, key))
            raise ClientError(
                f"Unknown parameter: '{where}' ({describe(obj[key])}) is not a field of {what}.",
                param=where,
                code="unknown_parameter",
            )


def want_object(value: Any, path: str) -> dict[str, Any]:
    """`value` as an object, else 400."""
    if not isinstance(value, dict):
        fail(path, value, "expected an object", code="invalid_type")
    return value


def want_list(value: Any, path: str) -> list[Any]:
    """`value` as an array, else 400."""
    if not isinstance(value, list):
        fail(path, value, "expected an array", code="invalid_type")
    return value


def want_str(value: Any, path: str) -> str:
    """`value` as a string, else 400."""
    if not isinstance(value, str):
        fail(path, value, "expected a string", code="invalid_type")
    return value


def want_bool(value: Any, path: str) -> bool:
    """`value` as a boolean, else 400."""
    if not isinstance(value, bool):
        fail(path, value, "expected a boolean", code="invalid_type")
    return value


def want_int(value: Any, path: str, *, low: int, high: int) -> int:
    """`value` as an integer in [low, high] (booleans are not integers here), else 400."""
    if isinstance(value, bool) or not isinstance(value, int):
        fail(path, value, "expected an integer", code="invalid_type")
    if not low <= value <= high:
        fail(path, value, f"expected an integer from {low} to {high}")
    return value


def want_number(value: Any, path: str, *, low: float, high: float) -> float:
    """`value` as a float in [low, high] (JSON integers allowed), else 400."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        fail(path, value, "expected a number", code="invalid_type")
    if not low <= value <= high:
        fail(path, value, f"expected a number from {low:g} to {high:g}")
    return float(value)


def want_choice(value: Any, path: str, choices: Collection[str]) -> str:
    """`value` as one of the strings in `choices`, else 400 listing them."""
    text = want_str(value, path)
    if text not in choices:
        listed = ", ".join(repr(choice) for choice in choices)
        fail(path, value, f"supported values are {listed}", code="unsupported_value")
    return text


def want_str_map(value: Any, path: str) -> dict[str, str]:
    """`value` as an object of string values (`metadata`), else 400."""
    obj = want_object(value, path)
    for key, item in obj.items():
        want_str(item, at(path, key))
    return obj


# -- the keys of the objects inside a request (the table: request/shapes.py) --------------------


@dataclass(frozen=True, slots=True)
class Shape:
    """The keys an object may have: `keys`, those OpenAI's spec gives its schemas (`spec`,
    component names of its OpenAPI description); `extra`, those real clients send that the spec
    lacks (openai-python's request types have them); `own`, this proxy's extensions. `inner`:
    the shapes of the values of some keys. `what` names the object in an error."""

    what: str
    keys: frozenset[str]
    spec: tuple[str, ...] = ()
    extra: frozenset[str] = frozenset()
    own: frozenset[str] = frozenset()
    inner: Mapping[str, Node] = field(default_factory=dict)

    @property
    def allowed(self) -> frozenset[str]:
        return self.keys | self.extra | self.own


@dataclass(frozen=True, slots=True)
class Kinds:
    """Objects told apart by `type`: `untyped` is the shape of one without it, `other` that of
    a type not listed (None: left to the object's reader, which says what is wrong)."""

    by_type: Mapping[str, Shape]
    untyped: Shape | None = None
    other: Shape | None = None

    def of(self, value: Mapping[str, Any]) -> Shape | None:
        kind = value.get("type")
        if kind is None:
            return self.untyped
        if not isinstance(kind, str):
            return None
        return self.by_type.get(kind, self.other)


@dataclass(frozen=True, slots=True)
class Many:
    """An array of objects of one node."""

    item: Shape | Kinds


Node = Shape | Kinds | Many


def check_shape(value: Any, node: Node, path: str) -> None:
    """Refuse the first key of `value`, or of an object inside it, outside its shape (400
    `unknown_parameter` naming the path). Only keys are looked at: values, and values of
    another JSON kind than the node's, are left to the readers."""
    if isinstance(node, Many):
        if isinstance(value, list):
            for index, item in enumerate(value):
                check_shape(item, node.item, at(path, index))
        return
    if not isinstance(value, dict):
        return
    shape = node.of(value) if isinstance(node, Kinds) else node
    if shape is None:
        return
    if not shape.allowed.issuperset(value):  # the common case costs one set test
        check_keys(value, shape.allowed, path, shape.what)
    for key, inner in shape.inner.items():
        if key in value:
            check_shape(value[key], inner, at(path, key))


def spec_only(value: Any, node: Node) -> Any:
    """`value` (checked by `check_shape`) without the keys the spec does not define, at every
    level the table knows: what a response object may echo of it."""
    if isinstance(node, Many):
        return [spec_only(item, node.item) for item in value] if isinstance(value, list) else value
    if not isinstance(value, dict):
        return value
    shape = node.of(value) if isinstance(node, Kinds) else node
    if shape is None:
        return value
    return {
        key: spec_only(item, shape.inner[key]) if key in shape.inner else item
        for key, item in value.items()
        if key in shape.keys
    }
