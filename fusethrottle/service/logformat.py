"""``log_format=json``: one JSON object per log line, for the log collectors of containers and
Kubernetes (Fluent Bit, Vector, Loki's promtail), which otherwise split a line on guesses.

The object carries what the text line carries, each under its own name: ``time`` (UTC, RFC 3339
with milliseconds), ``level``, ``logger``, ``message``, and ``exception`` when the text line would
be followed by a traceback. A message never spans lines: a newline inside it is escaped.
"""

from __future__ import annotations

import json
import logging
import time


class JsonFormatter(logging.Formatter):
    """Formats a record as a single-line JSON object (see the module's docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, str] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """UTC, so lines from hosts in different zones sort as one stream."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{stamp}.{int(record.msecs):03d}Z"
