"""The fence on a leading master's writes: each writing transaction proves its epoch.

A master's :class:`~jodl.log.store.Store` runs its statements on a view of the engine
(:func:`fenced`) that knows where to read the master's epoch. Before the first
statement of a transaction that writes (INSERT, UPDATE, DELETE, COPY), the same
transaction runs :func:`~jodl.log.lease.check_fence`: a lease row must still carry
that epoch, and it stays share-locked until the commit, so a takeover waits for the
write or ends it, and every write after a takeover is refused with
:class:`~jodl.exceptions.Fenced`. Run progress, run ends, node states, learning and
requests are fenced so without a check of their own; the outcome and dispatch
batches check the epoch stamped on them (:func:`check_fence` marks the transaction,
so it is checked once).

Epoch 0 (a standby that leads nothing, a command-line tool) writes unfenced.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, event

from .lease import CHECKED, check_fence

#: The execution option that carries the epoch source of a fenced engine.
OPTION = "jodl_fence"
#: A statement that writes: its first keyword, past a leading WITH of CTEs.
_WRITE = re.compile(r"\s*(?:WITH\b.*?)?\b(?:INSERT|UPDATE|DELETE|MERGE|COPY)\b", re.I | re.S)


def fenced(engine: Engine, epoch: Callable[[], int]) -> Engine:
    """A view of ``engine`` (same pool) whose writing transactions prove ``epoch()``."""
    if not event.contains(engine, "before_cursor_execute", _before_execute):
        event.listen(engine, "before_cursor_execute", _before_execute)
        event.listen(engine, "begin", _begin)
    return engine.execution_options(**{OPTION: epoch})


def _begin(conn: Connection) -> None:
    conn.info.pop(CHECKED, None)  # a new transaction proves its epoch again


def _before_execute(
    conn: Connection, cursor: Any, statement: str, parameters: Any, context: Any, many: bool
) -> None:
    if conn.get_execution_options().get(OPTION) is not None and _WRITE.match(statement):
        prove(conn)


def prove(conn: Connection) -> None:
    """Prove a fenced connection's epoch in its transaction, unless already proven: what
    a write through SQLAlchemy does itself, for a write that passes no hook (a COPY
    through the driver's own cursor). Unfenced: nothing."""
    source = conn.get_execution_options().get(OPTION)
    epoch = source() if source is not None else 0
    if epoch and conn.info.get(CHECKED) != epoch:
        check_fence(conn, epoch)


__all__ = ["OPTION", "fenced", "prove"]
