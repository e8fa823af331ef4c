"""The execution-id sequence: ids of executions and dispatches, never reused.

A row of its own (``jodl_exec_id``) rather than a column of the master's lease:
the on-demand queue takes ids without any master, and a standby master reads the
lease without touching the counter. A table, not a PostgreSQL SEQUENCE, so that
SQLite and PostgreSQL share one code path; ids are taken in blocks of
:data:`EXEC_ID_BLOCK`, one small UPDATE per block, so the row is rarely written.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from sqlalchemy import Engine, insert, select, update
from sqlalchemy.exc import IntegrityError

from ..exceptions import JodlError
from .models import ExecIdSequence

#: Execution ids taken per allocation (one UPDATE per block). Large, because a cycle
#: of 100,000 jobs should cost a handful of allocations; the ids a master did not use
#: before it stopped are skipped, which costs nothing.
EXEC_ID_BLOCK = 20_000


class ExecIds:
    """Hands out execution ids from committed blocks of the log's sequence row."""

    def __init__(self, engine: Engine, name: str = "master") -> None:
        self.engine = engine
        self.name = name
        self._ids: Iterator[int] = iter(())
        self._left = 0
        self._lock = threading.Lock()

    def take(self, count: int) -> list[int]:
        """``count`` fresh ids (increasing; allocated in committed blocks, never reused)."""
        out: list[int] = []
        with self._lock:
            while len(out) < count:
                if self._left == 0:
                    block = max(EXEC_ID_BLOCK, count - len(out))
                    start = self._allocate(block)
                    self._ids = iter(range(start, start + block))
                    self._left = block
                take = min(self._left, count - len(out))
                out.extend(next(self._ids) for _ in range(take))
                self._left -= take
        return out

    def next_free(self) -> int:
        """Every id handed out from now on is at least this (for tests and tools)."""
        with self.engine.connect() as conn:
            value = conn.scalar(
                select(ExecIdSequence.next_id).where(ExecIdSequence.name == self.name)
            )
        return int(value or 1)

    def _allocate(self, block: int) -> int:
        """Reserve ``block`` ids in one committed UPDATE; the first of them."""
        for _ in range(2):
            with self.engine.begin() as conn:
                end = conn.scalar(
                    update(ExecIdSequence)
                    .where(ExecIdSequence.name == self.name)
                    .values(next_id=ExecIdSequence.next_id + block)
                    .returning(ExecIdSequence.next_id)
                )
            if end is not None:
                return int(end) - block
            try:  # a database made without migrations: start the sequence
                with self.engine.begin() as conn:
                    conn.execute(insert(ExecIdSequence).values(name=self.name, next_id=1))
            except IntegrityError:
                pass  # started meanwhile by another process
        raise JodlError(f"cannot allocate execution ids from sequence {self.name!r}")
