"""Logging for fairlane's processes: JSON lines (default) or text, at the configured level.

``log_format: json`` writes one JSON object a line: ``ts``, ``level``, ``logger``, ``msg``, any
``extra`` fields and ``exc`` for a traceback. The gateway writes one ``fairlane.request`` line per
finished request (gateway/api/request_telemetry.py). Nothing here adds secrets: keys, tokens and
prompts never reach a log call (a test greps a whole run for them).
"""

from __future__ import annotations

import logging
import sys
import time

import orjson

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}
TEXT_FORMAT = "%(asctime)s {process} %(name)s %(levelname)s %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record; extra fields (``log.info(msg, extra={...})``) at the top level."""

    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        data = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "process": self.process,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                data[key] = value
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(data, default=str).decode()


def setup_logging(settings, process: str) -> None:
    """Configure the root logger of this process (``process``: gateway, worker) from the settings."""
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter(process))
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT.format(process=process)))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.log_level)
    for noisy in ("uvicorn.access",):  # one line per request is ours (fairlane.request), with more in it
        logging.getLogger(noisy).setLevel(logging.WARNING)
