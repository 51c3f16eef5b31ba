"""Structured logs: one event per line, key=value (default) or JSON (--log-format json)."""

from __future__ import annotations

import json
import logging
import logging.handlers
import sys
import time

#: ``node.log`` is rotated at this size, keeping LOG_BACKUPS old files (node.log.1 ...).
LOG_MAX_BYTES = 10 * 1024 * 1024
LOG_BACKUPS = 3


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        d = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            d["exc"] = self.formatException(record.exc_info)
        return json.dumps(d)


class _KvFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = f"ts={ts}.{int(record.msecs):03d}Z level={record.levelname.lower()} logger={record.name} {record.getMessage()}"
        if record.exc_info:
            line += " exc=" + json.dumps(self.formatException(record.exc_info))
        return line


def setup_logging(fmt: str = "kv", level: str = "info", logfile=None) -> None:
    root = logging.getLogger()
    root.handlers.clear()
    formatter = _JsonFormatter() if fmt == "json" else _KvFormatter()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter)
    root.addHandler(handler)
    if logfile is not None:
        logfile.parent.mkdir(parents=True, exist_ok=True)
        fh = logging.handlers.RotatingFileHandler(logfile, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS)
        fh.setFormatter(formatter)
        root.addHandler(fh)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
