"""Named records that cross the log's boundary, built here and nowhere else.

Rows that are hot (one per execution, one per claim) are ``NamedTuple``: they are
tuples in the order the log's statements take them, so a plain tuple of the same
order still works where only the order matters (the execution rows a bulk COPY
sends). Records the log must tell apart (a claim done or failed) are told apart by
their type, never by their length.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .models import ExecState


class ExecutionRow(NamedTuple):
    """One outcome row of the execution log (done, failed, lost, taken back, cancelled)."""

    id: int
    run_id: int | None
    job_id: int
    node_id: int | None
    attempt: int
    state: str
    backup: bool
    epoch: int
    sent_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    duration: float | None
    result: str | None
    error: str | None


#: Columns of an execution row, in :class:`ExecutionRow` order.
EXEC_COLUMNS: tuple[str, ...] = ExecutionRow._fields


class ClaimDone(NamedTuple):
    """A claimed on-demand job whose attempt ``attempt`` completed (on ``node_id``, which
    becomes its home if it has none)."""

    job_id: int
    attempt: int
    node_id: int | None = None


class ClaimFailed(NamedTuple):
    """A claimed on-demand job whose attempt failed: queued again at ``due_at``, or dead
    when ``due_at`` is None."""

    job_id: int
    attempt: int
    error: str
    due_at: dt.datetime | None


class DeadJob(NamedTuple):
    """A job of a run that used up its attempts."""

    job_id: int
    error: str | None
    run_id: int | None


class Home(NamedTuple):
    """A job's placement as the log keeps it: its permanent node and trial node."""

    job_id: int
    permanent_node_id: int | None
    trial_node_id: int | None


def split_claims(
    claims: Iterable[ClaimDone | ClaimFailed],
) -> tuple[list[ClaimDone], list[ClaimFailed]]:
    """Claims sorted by their type; anything else is a programming error, said loudly."""
    done: list[ClaimDone] = []
    failed: list[ClaimFailed] = []
    for claim in claims:
        if isinstance(claim, ClaimDone):
            done.append(claim)
        elif isinstance(claim, ClaimFailed):
            failed.append(claim)
        else:
            raise TypeError(f"a claim outcome must be ClaimDone or ClaimFailed, got {claim!r}")
    return done, failed


@dataclass(slots=True)
class OutcomeBatch:
    """What one commit of the log writer holds (see :meth:`Store.record_outcomes`)."""

    executions: Sequence[ExecutionRow] = ()
    dead: Sequence[DeadJob] = ()
    claims_done: Sequence[ClaimDone] = ()
    claims_failed: Sequence[ClaimFailed] = ()
    #: Dispatches whose executions all have an outcome now.
    closed: Sequence[int] = ()
    homes: Sequence[Home | tuple[int, int | None, int | None]] = ()
    #: Jobs with no home get the node of their result.
    settle: bool = False
    #: The writing master's lease epoch: the batch commits only while it holds the
    #: lease (0: unfenced, e.g. the on-demand queue's own writers).
    epoch: int = 0

    def __bool__(self) -> bool:
        return bool(
            self.executions
            or self.dead
            or self.claims_done
            or self.claims_failed
            or self.closed
            or self.homes
        )


class DoneResult(NamedTuple):
    """A committed result of a job, as applications read it."""

    exec_id: int
    job_id: int
    result: str | None
    finished_at: dt.datetime | None


class JobError(NamedTuple):
    """A job that was given up on (dead or deleted) and why."""

    job_id: int
    state: str
    error: str | None


class FailedAttempt(NamedTuple):
    """An attempt of a run that ended with an error, as an operator's page lists it."""

    key: str
    attempt: int
    address: str | None
    state: str
    error: str | None


class ProgressRow(NamedTuple):
    """How far a running execution is (a row of ``jodl_progress``)."""

    exec_id: int
    run_id: int | None
    job_id: int
    node_id: int | None
    done: float
    total: float | None
    note: str
    reported_at: dt.datetime


class RunningJob(NamedTuple):
    """A running job's newest progress report, as the run page and the API show it."""

    key: str
    address: str | None
    done: float
    total: float | None
    note: str
    reported_at: dt.datetime


class FamilyResult(NamedTuple):
    """A committed result of a family's job, read since a cursor (``exec_id``)."""

    exec_id: int
    key: str
    run_number: int | None  # None: an on-demand job's
    result: str | None
    finished_at: dt.datetime | None


class ExecutionView(NamedTuple):
    """One attempt of a run's job as the run page lists it (result and error cut to
    :data:`~jodl.log.reads.SHOWN_CHARS`)."""

    exec_id: int
    key: str
    address: str | None
    attempt: int
    state: str
    backup: bool
    sent_at: dt.datetime | None
    finished_at: dt.datetime | None
    duration: float | None
    result: str | None
    error: str | None


class JobTiming(NamedTuple):
    """When a job runs again by its every-N-cycles, as a schedule preview reads it."""

    job_id: int
    every_n_cycles: int
    last_run_number: int | None


@dataclass(slots=True)
class PendingJob:
    """A job of an open run (or a claimed on-demand job) with no committed result yet."""

    id: int
    key: str
    family: str
    payload: str
    priority: int
    run_id: int | None
    permanent_node_id: int | None
    trial_node_id: int | None
    attempts: int
    #: Nodes it failed on too often this run (shared :data:`NO_NODES` when none).
    failed_on: frozenset[int]
    #: For on-demand jobs: the attempt number that claimed it (guards completion).
    claim: int | None


#: The empty ``failed_on`` every job starts with: one object, not a set per job.
NO_NODES: frozenset[int] = frozenset()


@dataclass(slots=True)
class Sent:
    """An execution of an open dispatch with no outcome row: in flight, as far as the log knows."""

    exec_id: int
    job_id: int
    node_id: int
    attempt: int
    dispatch_id: int
    sent_at: dt.datetime
    run_id: int | None


@dataclass(frozen=True)
class JobResult:
    """What one job of a run gave: ``done`` with its ``result`` (decoded JSON), or the
    state of its last attempt (``failed``, ``dead``, ...) with its ``error``."""

    key: str
    state: str
    result: Any
    error: str | None

    @property
    def ok(self) -> bool:
        return self.state == ExecState.DONE


@dataclass(frozen=True)
class RunResults:
    """The results of one run of a family (:meth:`Store.results`)."""

    family: str
    run: int
    state: str
    jobs: list[JobResult] = field(default_factory=list)

    def __iter__(self) -> Iterator[JobResult]:
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)
