"""What the master's loop records: runs in progress, their summaries, execution rows.

An execution in flight is a :class:`jodl.store.Sent` (the same record the log
returns for executions it holds no outcome of), kept by the job book. Closing one
makes an execution row (:func:`execution_row`); :class:`Ledger` hands rows, with
the dispatches they close, to the log writer.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from .. import failpoint
from ..log.models import ExecState, FamilyRow, Run, RunState, utcnow
from ..log.records import ClaimDone, ClaimFailed, DeadJob, ExecutionRow, Home, PendingJob, Sent
from ..log.runs import makespan_ratio
from ..log.writer import LogWriter
from ..placement import JobInfo
from .book import JobBook


@dataclass
class RunSummary:
    """What a finished cycle did."""

    family: str
    run_id: int
    number: int
    resumed: bool
    total: int
    done: int
    failed: int
    dead: int
    elapsed: float
    makespan: float | None = None
    lower_bound: float | None = None
    #: Ended by ``jodl run cancel`` before its jobs were all done.
    cancelled: bool = False

    @classmethod
    def of_run(
        cls, run: Run, family: str, elapsed: float | None = None, resumed: bool = False
    ) -> RunSummary:
        """The summary of a run as its row in the log tells it (``elapsed``: from its
        start to its end in the log)."""
        if elapsed is None:
            elapsed = ((run.finished_at or run.started_at) - run.started_at).total_seconds()
        return cls(
            family=family,
            run_id=run.id,
            number=run.number,
            resumed=resumed,
            total=run.jobs_total,
            done=run.jobs_done,
            failed=run.jobs_failed,
            dead=run.jobs_dead,
            elapsed=elapsed,
            makespan=run.makespan,
            lower_bound=run.lower_bound,
            cancelled=run.state == RunState.CANCELLED,
        )

    @property
    def ratio(self) -> float | None:
        """makespan ÷ lower bound, or None where it would mislead: a resumed run (its
        bound counts work done before this master's makespan began, e.g. 0.82 after a
        takeover), a bound too short to measure (see
        :func:`jodl.log.runs.makespan_ratio`: tiny jobs gave 483) or below 1."""
        if self.resumed:
            return None
        return makespan_ratio(self.makespan, self.lower_bound)

    def line(self) -> str:
        rate = self.done / self.elapsed if self.elapsed > 0 else 0.0
        text = (
            f"run {self.family}#{self.number}{' (resumed)' if self.resumed else ''}"
            f"{' cancelled' if self.cancelled else ''}: "
            f"{self.done}/{self.total} done, {self.failed} failed attempts, {self.dead} dead, "
            f"{self.elapsed:.2f}s ({rate:.0f} jobs/s)"
        )
        if self.ratio:
            text += f", makespan {self.makespan:.2f}s = {self.ratio:.2f} x LB"
        return text


@dataclass
class ActiveRun:
    """A cycle the master is running: its counts so far."""

    run: Run
    family: FamilyRow
    total: int
    resumed: bool
    started: float
    first_send: float | None = None
    last_result: float | None = None
    done: int = 0
    failed: int = 0
    dead: int = 0
    #: Jobs read and not finished yet.
    remaining: int = 0
    #: Cancelled (``jodl run cancel``): closed as soon as its jobs left the book.
    cancelled: bool = False
    #: Order key after which the run's members are still to be read (None: all read).
    unread_after: tuple[int, int] | None = None

    @property
    def ended(self) -> bool:
        """Every job read and finished, or cancelled with none left in the book."""
        return self.remaining <= 0 and (self.unread_after is None or self.cancelled)


def job_info(job: PendingJob) -> JobInfo:
    """What placement may know of a job the master holds."""
    return JobInfo(
        job.id,
        job.key,
        job.family,
        job.priority,
        job.permanent_node_id,
        job.trial_node_id,
        job.failed_on,
        job.attempts,
    )


def execution_row(
    exec_id: int,
    sent: Sent,
    state: str,
    epoch: int,
    *,
    backup: bool = False,
    result: str | None = None,
    error: str | None = None,
    duration: float | None = None,
    finished: float | None = None,
) -> ExecutionRow:
    """The execution row closing ``sent``."""
    ended = _ts(finished) if finished is not None else utcnow()
    started = _ts(finished - duration) if finished is not None and duration is not None else None
    # Positional, in the fields' order: by keyword the record took twice as long (0.8 µs
    # against 0.35), once per result in the master's loop.
    return ExecutionRow(
        exec_id, sent.run_id, sent.job_id, sent.node_id, sent.attempt, state, backup, epoch,
        sent.sent_at, started, ended, duration, result, error,
    )  # fmt: skip


#: Outcomes after which the execution may still run on its agent: given up on without
#: its agent's word (its node gone or faulty). A replacement must not be logged before
#: they are (:meth:`Ledger.settle_giveups`). Not so an execution taken back: its agent
#: gave it back unstarted and will never start it (a master that dies before the row
#: is committed finds it not held), nor a cancelled one, which is not placed again
#: (a deleted job, a backup copy that lost the race, of an idempotent family).
GIVE_UPS = frozenset({ExecState.LOST})


class Ledger:
    """Closes executions in the book into rows and commits them through the log writer.

    Order of the log's writes: an execution given up on (lost with its node) is
    committed before any dispatch that replaces it
    (:meth:`settle_giveups`, called by the send step). A master killed between the
    two therefore leaves either the old execution open and no replacement (the next
    master asks its agent), or the old one closed (its agent cancels it when it
    connects again): never two open executions of one job that a resumed master
    would take for a backup copy and its original.
    """

    def __init__(self, book: JobBook, writer: LogWriter) -> None:
        self.book = book
        self.writer = writer
        #: A batch with a given-up execution was handed to the writer and may be uncommitted.
        self.giveups_pending = False

    def commit(
        self,
        rows: Sequence[ExecutionRow],
        dead: Sequence[DeadJob] = (),
        claims: Iterable[ClaimDone | ClaimFailed] = (),
        after: Callable[[], None] | None = None,
        settle: bool = False,
    ) -> None:
        """Commit outcome rows (and the dispatches they close) through the log writer."""
        closed = self.book.take_closed_dispatches()
        if not self.giveups_pending:
            self.giveups_pending = any(row.state in GIVE_UPS for row in rows)
        self.writer.submit(rows, dead, claims, closed, after, settle=settle)

    def settle_giveups(self) -> bool:
        """Wait until every given-up execution handed to the writer is committed: before
        a dispatch that may replace one is logged (a rare wait: after a loss or a steal).
        True when there were some."""
        if not self.giveups_pending:
            return False
        self.writer.flush()
        self.giveups_pending = False
        failpoint.hit("giveups_committed")
        return True

    def write_homes(self) -> None:
        """Hand the homes decided since the last call to the log writer (committed in order)."""
        changes = self.book.take_home_changes()
        if changes:
            self.writer.submit((), homes=[Home(j, p, t) for j, (p, t) in changes.items()])


def _ts(unix: float) -> dt.datetime:
    """A naive UTC datetime from a unix time (the log stores naive UTC)."""
    return _EPOCH + _DELTA(0, unix)  # (days, seconds): a third faster than seconds=unix


_EPOCH = dt.datetime(1970, 1, 1)
_DELTA = dt.timedelta
