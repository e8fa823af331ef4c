"""The log writer: commits outcome batches in order, off the master's thread.

The master hands each batch of outcome rows to :class:`LogWriter` and goes on
sending and collecting while the database works; the batch's ``after`` callback
(which releases the acknowledgements to the agents) runs only once the batch is
committed, so "commit before acknowledging" holds exactly as with a synchronous
commit. One thread, one queue: batches commit in the order they were made. A
failed commit stops the writer; the master re-raises the error on its next call.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .. import failpoint
from ..obs import tracing
from ..obs.metrics import WRITER_COMMIT
from .models import ExecState
from .records import ClaimDone, ClaimFailed, DeadJob, ExecutionRow, Home, OutcomeBatch, split_claims
from .store import Store

_STOP = object()


class LogWriter:
    """Commits :meth:`Store.record_outcomes` batches in a background thread, in order."""

    def __init__(self, store: Store) -> None:
        self.store = store
        #: The master's lease epoch, stamped on every batch (its commit is fenced by it).
        self.epoch = 0
        self._queue: queue.Queue[Any] = queue.Queue()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
        self._thread.start()

    def submit(
        self,
        executions: Sequence[ExecutionRow],
        dead: Sequence[DeadJob] = (),
        claims: Iterable[ClaimDone | ClaimFailed] = (),
        closed: Sequence[int] = (),
        after: Callable[[], None] | None = None,
        homes: Sequence[Home | tuple[int, int | None, int | None]] = (),
        settle: bool = False,
    ) -> None:
        """Queue one batch (see :meth:`Store.record_outcomes`); ``after`` runs in the
        writer thread once it is committed. ``claims`` are sorted by their type."""
        self.check()
        done, failed = split_claims(claims)
        batch = OutcomeBatch(
            executions=executions,
            dead=dead,
            claims_done=done,
            claims_failed=failed,
            closed=closed,
            homes=homes,
            settle=settle,
            epoch=self.epoch,
        )
        self._queue.put((batch, after))

    def flush(self) -> None:
        """Wait until every queued batch is committed (and its ``after`` has run)."""
        self._queue.join()
        self.check()

    def depth(self) -> int:
        """Batches queued and not committed yet (for metrics)."""
        return self._queue.qsize()

    def check(self) -> None:
        """Raise the error that stopped the writer, if any."""
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                if self._error is not None:
                    continue  # after a failure nothing more is committed (or acknowledged)
                batch, after = item
                try:
                    failpoint.hit("before_commit")
                    if failpoint.slow("commit_lost") and any(
                        row.state == ExecState.LOST for row in batch.executions
                    ):
                        failpoint.wait("commit_lost")
                    traced = time.time_ns() if tracing.state.on else 0
                    started = time.perf_counter()
                    self.store.record_outcomes(batch)
                    WRITER_COMMIT.observe(time.perf_counter() - started)
                    if traced:
                        tracing.committed(batch.executions, traced)
                    failpoint.hit("after_commit")
                    if after is not None:
                        after()
                except BaseException as exc:  # noqa: BLE001 - handed to the master's thread
                    self._error = exc
            finally:
                self._queue.task_done()
