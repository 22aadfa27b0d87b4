"""Logging: one JSON object per line (or text), request id on every line; never content.

Prompts, outputs and credentials are never logged unless `log_content` is set (debug only).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson

LOGGER_NAME = "responses_repair_proxy"
#: Attribute names of a LogRecord; anything else given in `extra` is a field of ours.
_RESERVED = frozenset([*vars(logging.makeLogRecord({})), "message", "asctime"])


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
                line[key] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(line, default=str).decode()


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(
            f"{key}={value}" for key, value in vars(record).items() if key not in _RESERVED
        )
        text = f"{self.formatTime(record)} {record.levelname:<7} {record.getMessage()}"
        if fields:
            text += " " + fields
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure(level: str, fmt: str) -> logging.Logger:
    """Route our logger (and uvicorn's) to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    for name in (LOGGER_NAME, "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers = [handler]
        logger.setLevel(level.upper())
        logger.propagate = False
    # uvicorn's access log would duplicate our per-request line (and log query strings).
    logging.getLogger("uvicorn.access").disabled = True
    return logging.getLogger(LOGGER_NAME)


def get_logger() -> logging.Logger:
    return logging.getLogger(LOGGER_NAME)
