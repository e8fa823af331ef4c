"""Planner settings for the statements whose right plan does not depend on the data.

A few statements have one good plan whatever the tables hold, and PostgreSQL finds it
only with statistics. Right after a bulk add (no statistics yet), or on a queue table
whose last statistics counted no queued job, it guesses a handful of rows and picks a
plan that reads every row of a family. Such a statement turns the wrong kinds of plan
off for itself: :func:`set_local` for the rest of its transaction, :func:`scoped` for
a block of statements only. Each call site says which plan it avoids and what it cost.
On SQLite both do nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, text


def _statement(count: int, read: bool) -> Any:
    calls = [f"set_config(:n{i}, :v{i}, true)" for i in range(count)]
    if read:
        calls = [f"current_setting(:n{i})" for i in range(count)] + calls
    return text("SELECT " + ", ".join(calls))


def _params(settings: dict[str, str]) -> dict[str, str]:
    params: dict[str, str] = {}
    for i, (name, value) in enumerate(settings.items()):
        params[f"n{i}"], params[f"v{i}"] = name, value
    return params


def set_local(conn: Connection, **settings: str) -> None:
    """Planner ``settings`` (``enable_sort="off"``, ...) for the rest of ``conn``'s
    transaction, in one statement."""
    if settings and conn.dialect.name == "postgresql":
        conn.execute(_statement(len(settings), read=False), _params(settings))


@contextlib.contextmanager
def scoped(conn: Connection, **settings: str) -> Iterator[None]:
    """Planner ``settings`` for the statements of the block, put back after it: the
    transaction's other statements keep their plans."""
    if not settings or conn.dialect.name != "postgresql":
        yield
        return
    was = conn.execute(_statement(len(settings), read=True), _params(settings)).one()
    try:
        yield
    finally:
        before = dict(zip(settings, was[: len(settings)], strict=True))
        conn.execute(_statement(len(before), read=False), _params(before))


__all__ = ["scoped", "set_local"]
