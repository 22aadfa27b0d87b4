"""Logging: one JSON object per line (or text), request id on every line; never content.

Prompts, outputs and credentials are never logged unless `log_content` is set (debug only).

Field values are often the client's (a model name, a path): every string field is cut to
`FIELD_CHARS` characters, and in the text format every value that could be read as more than
one `key=value` is quoted with its control characters escaped, so no client string can forge a
log line or a field (a CR/LF in a model name would start a forged line; a 1 MB model name
would go whole into one line). The JSON format escapes by itself (orjson).
"""

from __future__ import annotations

import logging
import re
import sys
import textwrap
from typing import Any

import orjson

LOGGER_NAME = "responses_repair_proxy"
#: Attribute names of a LogRecord; anything else given in `extra` is a field of ours.
_RESERVED = frozenset([*vars(logging.makeLogRecord({})), "message", "asctime"])
#: Longest string field value written; the rest is replaced by its length.
FIELD_CHARS = 256
#: What a text-format value may not hold bare: controls (C0, DEL, C1), Unicode line and
#: paragraph separators, and what would end or split a `key=value`.
_NEEDS_QUOTES = re.compile(r'[\x00-\x20\x7f-\x9f\u2028\u2029"\\=]')
_ESCAPED = re.compile(r'[\x00-\x1f\x7f-\x9f\u2028\u2029"\\]')
_BREAKING = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")  # all but \n
_JSON_BREAKS = (("\x85", "\\u0085"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029"))
_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t", '"': '\\"', "\\": "\\\\"}


def capped(value: str) -> str:
    """`value`, cut to `FIELD_CHARS` characters (with the length it had)."""
    if len(value) <= FIELD_CHARS:
        return value
    return f"{value[:FIELD_CHARS]}…[{len(value)} chars]"


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _SHORT.get(char) or (
        f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
    )


def text_value(value: Any) -> str:
    """A field value for the text format: bare when safe, else quoted and escaped."""
    text = capped(value) if isinstance(value, str) else str(value)
    if text and not _NEEDS_QUOTES.search(text):
        return text
    return '"' + _ESCAPED.sub(_escape, text) + '"'


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _RESERVED:
                line[key] = capped(value) if isinstance(value, str) else value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        text = orjson.dumps(line, default=str).decode()
        if not text.isascii():
            # orjson leaves these raw (valid JSON), but readers that split lines on them would
            # see a record end inside a client's string: escaped, they stay one line anywhere.
            for char, escaped in _JSON_BREAKS:
                text = text.replace(char, escaped)
        return text


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(
            f"{key}={text_value(value)}"
            for key, value in vars(record).items()
            if key not in _RESERVED
        )
        message = _BREAKING.sub(_escape, record.getMessage())
        text = f"{self.formatTime(record)} {record.levelname:<7} {message}"
        if fields:
            text += " " + fields
        if record.exc_info:
            # Indented, so that no line of it (an exception message quoting a client) can pass
            # for a record of its own.
            trace = _CONTROL.sub(_escape, self.formatException(record.exc_info))
            text += "\n" + textwrap.indent(trace, "    ", lambda line: True)
        return text


def configure(level: str, fmt: str, **fields: Any) -> logging.Logger:
    """Route our logger (and uvicorn's) to stderr in the chosen format; `fields` go on every
    line (a worker process's `worker` number)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    if fields:
        handler.addFilter(_Fields(fields))
    for name in (LOGGER_NAME, "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(level.upper())
        logger.propagate = False
    # uvicorn's access log would duplicate our per-request line (and log query strings).
    logging.getLogger("uvicorn.access").disabled = True
    return logging.getLogger(LOGGER_NAME)


class _Fields(logging.Filter):
    def __init__(self, fields: dict[str, Any]) -> None:
        super().__init__()
        self._fields = fields

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in self._fields.items():
            setattr(record, key, value)
        return True


def get_logger() -> logging.Logger:
    return logging.getLogger(LOGGER_NAME)
