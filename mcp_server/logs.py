"""Diagnostics of ccw-mcp: everything goes through ``logging`` to stderr (stdout carries frames).

- ccw's own records use loggers under ``ccw.`` (``LOGGER`` for the server); the SDK's
  (``mcp.*``), hypercorn's and the embedded helper's lines (``ccw.helper``) go to the same
  handler, so nothing is printed behind the level's back.
- Level: ``--log-level`` or ``CCW_LOG_LEVEL`` (debug, info, warning, error; default info).
  The lifecycle lines seed 001 fixes (``mcp:ready …``, ``mcp:draining …``,
  ``mcp:shutdown …``) go to ``LIFECYCLE``, which stays at info under a quieter level:
  scripts and supervisors wait for them, so a log level must not hide them.
- Format: ``text`` (default) prints a ccw record as its message alone, so the seed's
  lines stay byte for byte what it specifies; other loggers' records are prefixed with
  their level and name (``WARNING mcp.server.lowlevel: …``).  ``json`` (``--log-format
  json`` or ``CCW_LOG_FORMAT=json``) prints one object per line: ``ts`` (ISO 8601 UTC),
  ``level``, ``logger``, ``message``, and ``exc`` with the traceback when there is one.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import TextIO

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
LOGGER = logging.getLogger("ccw.mcp")
LIFECYCLE = logging.getLogger("ccw.mcp.lifecycle")
_HANDLER_NAME = "ccw-stderr"


class TextFormatter(logging.Formatter):
    """ccw's own records as their bare message; anyone else's with level and logger name."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line (a traceback, if any, follows on the next lines)."""
        message = record.getMessage()
        if not record.name.startswith("ccw."):
            message = f"{record.levelname} {record.name}: {message}"
        if record.exc_info:
            message = f"{message}\n{self.formatException(record.exc_info)}"
        return message


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a JSON line."""
        entry = {
            "ts": datetime.datetime.fromtimestamp(record.created, datetime.UTC)
            .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str = "info", fmt: str = "text", stream: TextIO | None = None) -> None:
    """Send every record at ``level`` or above to stderr (or ``stream``) in ``fmt``.

    Idempotent: a second call replaces ccw's handler instead of adding one.
    """
    if level not in LEVELS:
        raise ValueError(f"log level {level!r}: use one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: use one of {', '.join(FORMATS)}")
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler.get_name() == _HANDLER_NAME:
            root.removeHandler(handler)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root.addHandler(handler)
    numeric = logging.getLevelNamesMapping()[level.upper()]
    root.setLevel(numeric)
    LIFECYCLE.setLevel(min(numeric, logging.INFO))
