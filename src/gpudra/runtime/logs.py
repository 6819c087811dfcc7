"""Logging set-up: human-readable text or one JSON object per line. I/O: stderr.

Context goes in `extra=` (claim UID, error, ...) and is printed as key=value pairs or JSON fields, so
every line about a claim carries its UID in a field that log tooling can filter on.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Literal

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def _context(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_context(record),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        context = " ".join(f"{k}={v}" for k, v in _context(record).items())
        when = self.formatTime(record, "%H:%M:%S")
        text = f"{when} {record.levelname[0]} {record.name}: {record.getMessage()}"
        text = f"{text} {context}" if context else text
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


def configure(*, fmt: Literal["text", "json"], level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
