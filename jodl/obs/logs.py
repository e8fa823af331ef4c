"""Log records for people or for machines (``JODL_LOG_FORMAT``).

``text`` (the default) is the familiar one-line format. ``json`` writes one JSON
object per record with ``time``, ``level``, ``logger``, ``message``, the process
``role`` (master, agent, web, cli) and, where known, ``run_id``, ``family``,
``node`` and ``job``. Those come from the record (``log.info(..., extra={...})``)
or from :func:`context`, a context variable a thread or task sets around its work.

The JSON formatter is a few lines over :mod:`json`; a library for it would bring
more than it saves.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: Formats JODL_LOG_FORMAT accepts.
LOG_FORMATS = ("text", "json")
#: The text format (as before JSON logs existed).
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
#: Fields a record may carry about the work it concerns, in output order.
CONTEXT_FIELDS = ("run_id", "family", "node", "job")

#: Loggers of libraries kept at WARNING (their INFO lines, e.g. a scheduler's two lines
#: every couple of seconds, would bury what JODL prints); JODL_LOG_LEVEL=DEBUG shows all.
QUIET_LIBRARIES = (
    "alembic",
    "apscheduler",
    "waitress",
    "rpyc",
    "aiosmtpd",
    "mail.log",
    "asyncio",
    "httpx",
    "apprise",
)


_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "jodl_log_context", default=None
)
_role = "cli"


@contextmanager
def context(**fields: Any) -> Iterator[None]:
    """Add ``fields`` (run_id, family, node, job) to every record logged inside the block."""
    merged = {**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}}
    token = _context.set(merged)
    try:
        yield
    finally:
        _context.reset(token)


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module's docstring for the keys)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "role": _role,
            "logger": record.name,
            "message": record.getMessage(),
        }
        ctx = _context.get() or {}
        for key in CONTEXT_FIELDS:
            value = getattr(record, key, None)
            if value is None:
                value = ctx.get(key)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str, fmt: str = "text", role: str = "cli") -> None:
    """Set up the root logger once per process: ``level``, ``fmt`` (text/json), ``role``."""
    global _role
    _role = role
    quiet = level.upper() != "DEBUG"
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(logging.WARNING if quiet else logging.NOTSET)
    root = logging.getLogger()
    if getattr(root, "_jodl_configured", False):
        return
    root._jodl_configured = True  # type: ignore[attr-defined]
    formatter = JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)
    if root.handlers:
        # A host program (or pytest) set logging up: keep it, as logging.basicConfig
        # does, only switching its console handlers to JSON when asked.
        if fmt == "json":
            for existing in root.handlers:
                if type(existing) is logging.StreamHandler:
                    existing.setFormatter(formatter)
        return
    handler = logging.StreamHandler()
    handler.setFormatter(formatter)
    root.addHandler(handler)
    root.setLevel(level.upper())


__all__ = ["LOG_FORMATS", "JsonFormatter", "configure", "context"]
