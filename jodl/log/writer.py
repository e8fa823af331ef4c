"""The log writer: commits outcome batches in order, off the master's thread.

The master hands each batch of outcome rows to :class:`LogWriter` and goes on
sending and collecting while the database works; the batch's ``after`` callback
(which releases the acknowledgements to the agents) runs only once the batch is
committed, so "commit before acknowledging" holds exactly as with a synchronous
commit. One thread, one queue: batches commit in the order they were made, those
queued meanwhile together (:data:`GROUP_COMMIT`). A failed commit stops the writer;
the master re-raises the error on its next call.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

from .. import failpoint
from ..obs import tracing
from ..obs.metrics import WRITER_COMMIT
from .models import ExecState
from .records import ClaimDone, ClaimFailed, DeadJob, ExecutionRow, Home, OutcomeBatch, split_claims
from .store import Store

_STOP = object()
#: Most batches committed in one transaction: those queued while the last commit ran.
#: The master queues a batch per agent per loop step; on 500 agents one commit each
#: left the writer a minute behind a cycle of 100,000 no-op jobs (bench/farm.py).
#: Consecutive batches of results are written as one (:func:`_merged`): a statement set
#: per batch made the transaction long, and the lease renewal waits for it (the fence
#: holds the lease row).
GROUP_COMMIT = 1000


def _merged(batches: list[OutcomeBatch]) -> list[OutcomeBatch]:
    """``batches`` with each run of consecutive ones that hold the master's results
    (executions, closed dispatches, closed claims) of one epoch and ``settle``, made
    one: the log folds executions per (job, node) whatever batch they came in, and a
    claim is closed by its own attempt's guard. Not merged: dead jobs and homes, which
    are written in their order among the results.

    On-demand results were not merged at first: a commit then ran the statements of
    every batch it held, each waiting for the interpreter after its round trip, and
    the writer set the pace of on-demand jobs (``bench/ondemand.py``)."""
    out: list[OutcomeBatch] = []
    for batch in batches:
        last = out[-1] if out else None
        if (
            last is not None
            and _plain(last)
            and _plain(batch)
            and (last.epoch, last.settle) == (batch.epoch, batch.settle)
        ):
            out[-1] = replace(
                last,
                executions=[*last.executions, *batch.executions],
                claims_done=[*last.claims_done, *batch.claims_done],
                claims_failed=[*last.claims_failed, *batch.claims_failed],
                closed=[*last.closed, *batch.closed],
            )
        else:
            out.append(batch)
    return out


def _plain(batch: OutcomeBatch) -> bool:
    return not (batch.dead or batch.homes)


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
            items = [self._queue.get()]
            while len(items) < GROUP_COMMIT and items[-1] is not _STOP:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            work = [item for item in items if item is not _STOP]
            try:
                # after a failure nothing more is committed (or acknowledged)
                if work and self._error is None:
                    self._commit(work)
            finally:
                for _ in items:
                    self._queue.task_done()
            if items[-1] is _STOP:
                return

    def _commit(self, work: list[tuple[OutcomeBatch, Callable[[], None] | None]]) -> None:
        """Commit ``work``'s batches in one transaction, then run their ``after``s in order."""
        batches = _merged([batch for batch, _after in work])
        try:
            failpoint.hit("before_commit")
            if failpoint.slow("commit_lost") and any(
                row.state == ExecState.LOST for batch in batches for row in batch.executions
            ):
                failpoint.wait("commit_lost")
            traced = time.time_ns() if tracing.state.on else 0
            started = time.perf_counter()
            self.store.record_outcomes(*batches)
            WRITER_COMMIT.observe(time.perf_counter() - started)
            if traced:
                for batch in batches:
                    tracing.committed(batch.executions, traced)
            failpoint.hit("after_commit")
            for _batch, after in work:
                if after is not None:
                    after()
        except BaseException as exc:  # noqa: BLE001 - handed to the master's thread
            self._error = exc
