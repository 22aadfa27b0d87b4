"""JSON Schema checks of `text.format`, with `jsonschema` and the `regex` module. Sans-IO.

Imported by `constraint.py` when a request first names a schema, not at start-up: `jsonschema`,
`referencing`, `rpds` and `regex` are ~7 MB of every process that loads them
(bench/idle_memory.py), and most proxies never see a schema.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import jsonschema
import jsonschema.validators
import orjson
import regex
from jsonschema.exceptions import SchemaError, ValidationError, best_match
from referencing.exceptions import Unresolvable

_SHOWN = 200  # characters of a validation message quoted back


class Unapplicable(Exception):
    """The schema cannot be applied to a value (a bad `$ref`, an invalid subschema)."""


def validator(schema: dict[str, Any]) -> Any:
    """A validator of `schema` (its draft's, regex keywords bounded in time)."""
    return _validator_class(schema)(schema)


def mismatch(checker: Any, value: Any) -> tuple[str, str] | None:
    """Where and why `value` does not match (None: it matches); `Unapplicable` when the schema
    cannot be applied. A RecursionError (JSON nested too deeply) is the caller's."""
    try:
        error = best_match(checker.iter_errors(value))
    except (SchemaError, Unresolvable) as exc:
        raise Unapplicable(str(exc)) from None
    if error is None:
        return None
    return str(error.json_path), str(error.message)


def check_schema(schema: dict[str, Any]) -> str | None:
    """Why `schema` is no valid JSON Schema (None: it is one), for a 400 before generation.

    Checking a schema against its meta-schema costs ~2.5 ms; an agent sends the same schema
    on every call, so the verdicts of the last `_SCHEMAS` schemas (by their JSON) are kept."""
    return _schema_problem(orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))


_SCHEMAS = 256


@functools.lru_cache(maxsize=_SCHEMAS)
def _schema_problem(text: bytes) -> str | None:
    schema = orjson.loads(text)
    try:
        _validator_class(schema).check_schema(schema)
    except SchemaError as exc:
        return exc.message[:_SHOWN]
    return None


#: The drafts a schema may name in `$schema`; any other (or none) is read as Draft 2020-12, the
#: draft OpenAI's structured outputs follow (`validator_for` would warn for an unknown one).
_DRAFTS = {
    str(cls.META_SCHEMA["$schema" if "$schema" in cls.META_SCHEMA else "id"]).rstrip("#"): cls
    for cls in (
        jsonschema.Draft4Validator,
        jsonschema.Draft6Validator,
        jsonschema.Draft7Validator,
        jsonschema.Draft201909Validator,
        jsonschema.Draft202012Validator,
    )
}


def _validator_class(schema: dict[str, Any]) -> Any:
    named = schema.get("$schema")
    found = _DRAFTS.get(named.rstrip("#")) if isinstance(named, str) else None
    return _BOUNDED[found or jsonschema.Draft202012Validator]


#: Seconds one `pattern` / `patternProperties` search of a client's regex may take. The
#: patterns come from the request: with Python's `re`, `^(a+)+$` against 30 `a`s and a `!`
#: backtracks for minutes, on the event loop. The `regex` module stops a search at a timeout.
PATTERN_SECONDS = 0.05


@functools.lru_cache(maxsize=_SCHEMAS)
def _compiled(pattern: str) -> Any:
    return regex.compile(pattern)


def _search(pattern: str, text: str) -> bool:
    """Whether `pattern` matches in `text`; raises ValidationError if it cannot be told in
    `PATTERN_SECONDS` or the pattern is no regex."""
    try:
        return _compiled(pattern).search(text, timeout=PATTERN_SECONDS) is not None
    except TimeoutError:
        raise ValidationError(
            f"the pattern {pattern[:_SHOWN]!r} takes too long to check (over "
            f"{PATTERN_SECONDS:g} s: catastrophic backtracking)"
        ) from None
    except regex.error as exc:
        raise ValidationError(f"the pattern {pattern[:_SHOWN]!r} is no regex ({exc})") from None


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "string"):
        return
    try:
        if not _search(pattern, instance):
            yield ValidationError(f"{instance[:_SHOWN]!r} does not match {pattern[:_SHOWN]!r}")
    except ValidationError as error:
        yield error


def _pattern_properties(
    validator: Any, patterns: dict[str, Any], instance: Any, schema: Any
) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            try:
                matched = _search(pattern, key)
            except ValidationError as error:
                yield error
                return
            if matched:
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


#: Each draft's validator with the two regex keywords bounded in time (`PATTERN_SECONDS`).
_EXTEND: Any = jsonschema.validators.extend  # untyped in types-jsonschema
_BOUNDED = {
    cls: _EXTEND(cls, {"pattern": _pattern, "patternProperties": _pattern_properties})
    for cls in _DRAFTS.values()
}
