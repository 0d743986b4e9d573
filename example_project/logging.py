"""A JSON-lines log formatter, standard library only.

Each record becomes one JSON object on one line: ``time`` (UTC, ISO 8601), ``level``,
``logger``, ``message``, every attribute that is not a standard ``LogRecord`` attribute
(that is, everything passed with ``extra=``, such as django_fencedjobs' ``event``,
``job``, ``fence``, ``outcome``, ``items``, ``duration``), and ``exc_info`` as text when
there is one. Values JSON cannot encode are written with ``str()``.

This module is ``example_project.logging``; inside it ``import logging`` is still the
standard library's (imports are absolute).
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

#: The attributes every LogRecord has; anything else on a record came from ``extra=``.
STANDARD_ATTRIBUTES = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None)).keys()
) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in STANDARD_ATTRIBUTES and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)
