"""Connecting to the reconstruction log: engines for SQLite and PostgreSQL."""

from __future__ import annotations

import os
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from ..exceptions import StoreUnavailable


def normalise_url(url: str) -> str:
    """Accept ``postgresql://`` and ``postgres://`` URLs by selecting psycopg 3."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for ``url``, checked to answer; :class:`StoreUnavailable` if it does not."""
    url = normalise_url(url)
    if url.startswith("sqlite"):
        _create_private(make_url(url).database)
        kwargs.setdefault("connect_args", {"check_same_thread": False, "timeout": 30})
        engine = create_engine(url, **kwargs)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

    else:
        kwargs.setdefault("pool_pre_ping", True)
        engine = create_engine(url, **kwargs)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise StoreUnavailable(
            f"cannot reach the database {engine.url.render_as_string(hide_password=True)}: {reason}"
        ) from None
    return engine


def _create_private(path: str | None) -> None:
    """Create a new SQLite file readable by its owner only (0600).

    It holds password hashes, addresses and page text. SQLite gives its -wal and
    -shm files the database file's mode. An existing file keeps its mode."""
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError:
        pass  # it exists, or no such directory (SQLite reports that on connecting)


def missing_sqlite_file(url: str) -> str | None:
    """The path of a SQLite database file that does not exist yet (None: not that case).

    Opening it would create an empty file: a read must not leave one behind.
    """
    try:
        parsed = make_url(normalise_url(url))
    except Exception:  # noqa: BLE001 - reported when the engine is made
        return None
    path = parsed.database
    if not parsed.drivername.startswith("sqlite") or not path or path == ":memory:":
        return None
    if path.startswith("file:"):
        return None  # a URI filename: its own mode decides
    return None if os.path.exists(path) else path


def ensure_schema(engine: Engine) -> None:
    """Bring the database to the newest migration (``jodl db upgrade``)."""
    from .migrate import upgrade

    upgrade(engine)
