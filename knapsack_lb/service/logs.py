"""Structured logging for the services: text or one JSON object per line on standard error.

Every record carries its logger, level, message and wall-clock time; ``extra={...}`` fields
given at the call site (``vip``, ``dip``, ``version`` ...) become keys of the JSON object,
so log shippers can filter on them without parsing text.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def record_extras(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra=`` fields of a record."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD_ATTRS and not k.startswith("_")}


class JsonLinesFormatter(logging.Formatter):
    """One JSON object per record: time (ISO 8601, UTC), level, logger, message, extras, exception."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record_extras(record).items():
            data.setdefault(key, value)
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str, separators=(",", ":"))


class TextFormatter(logging.Formatter):
    """``time level logger: message key=value ...``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        extras = record_extras(record)
        if extras:
            text += " " + " ".join(f"{k}={v}" for k, v in extras.items())
        return text


def configure_logging(level: str = "INFO", json_lines: bool = False, stream: TextIO | None = None) -> None:
    """Replace the root logger's handlers with one writing to ``stream`` (stderr by default).

    uvicorn's own loggers are routed through the root logger so its lines share the format.
    """
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonLinesFormatter() if json_lines else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uv = logging.getLogger(name)
        uv.handlers.clear()
        uv.propagate = True
    logging.getLogger("uvicorn.access").setLevel(max(logging.getLevelName(level), logging.WARNING))
