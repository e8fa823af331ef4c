"""Runs (cycles of a family): opening, membership, resuming, counting, closing, results."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Engine,
    Select,
    delete,
    exists,
    func,
    insert,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.orm import Session, sessionmaker

from ..exceptions import JodlError
from . import budgets, limits, plans
from .models import (
    Dispatch,
    ExecState,
    Execution,
    FamilyRow,
    Job,
    JobProgress,
    JobState,
    Run,
    RunState,
    utcnow,
)
from .records import NO_NODES, JobResult, PendingJob, ProgressRow, RunResults, Sent

#: How long a progress report no run end clears is kept.
PROGRESS_KEPT = dt.timedelta(days=1)
#: Seconds a run's lower bound must reach for makespan ÷ bound to be shown: twice the
#: master loop's longest pause (``JODL_IDLE_SLEEP``'s default, 50 ms). A result waits up
#: to one pause to be seen and a send up to another, so a run whose jobs take about
#: that long measures the loop's own overhead, not placement (tiny jobs printed 483).
MIN_LOWER_BOUND = 0.1
#: Members of a run read at once when all are read (:meth:`Runs.run_jobs`).
WHOLE_WINDOW = 50_000
#: Ids per ``IN`` list.
CHUNK = 5000


@dataclass(frozen=True)
class RunWindow:
    """Jobs of a run read together, and where its next window starts."""

    jobs: list[PendingJob]
    #: Order key (last run, id) of the window's last member; None: no member follows.
    next_after: tuple[int, int] | None


def makespan_ratio(makespan: float | None, lower_bound: float | None) -> float | None:
    """makespan ÷ lower bound as shown (``jodl run``, ``jodl status``, the run pages).

    None (no ratio shown) when either is unknown, when the bound is under
    :data:`MIN_LOWER_BOUND` (the loop's overhead would dominate), or when the ratio
    would be below 1: no schedule beats its lower bound, so such a bound did not
    describe the makespan measured (the master records none for a resumed run, whose
    jobs in flight at the takeover had run partly before its makespan began).
    """
    if not makespan or lower_bound is None or lower_bound < MIN_LOWER_BOUND:
        return None
    ratio = makespan / lower_bound
    return ratio if ratio >= 1.0 else None


class Runs:
    """Reads and writes of runs and of what their jobs gave."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)

    def open_run(self, family: FamilyRow, epoch: int) -> tuple[Run, bool]:
        """The family's unfinished run (resumed: True) or a new one with its due jobs.

        A run's jobs are not written one by one: the run records what fixes its
        membership (number, opening time, the newest job id then), and
        :meth:`run_jobs` selects the members again with the same rule on resume.
        """
        with self.sessions() as s, s.begin():
            run = s.scalar(
                select(Run)
                .where(Run.family_id == family.id, Run.state == RunState.RUNNING)
                .order_by(Run.number.desc())
                .limit(1)
            )
            if run is not None:
                # Resumed only if a master worked on it: a run an application opened
                # (epoch 0) to record its id is new to the master that runs it.
                resumed = run.epoch != 0
                run.epoch = epoch
                return run, resumed
            number = (
                s.scalar(select(func.max(Run.number)).where(Run.family_id == family.id)) or 0
            ) + 1
            run = Run(
                family_id=family.id,
                number=number,
                epoch=epoch,
                started_at=utcnow(),
                max_job_id=s.scalar(select(func.max(Job.id)).where(Job.family_id == family.id)),
            )
            s.add(run)
            s.flush()
            recent = _too_recent(s, run)
            members = _member_filter(run)
            run.jobs_total = (s.scalar(select(func.count()).where(*members)) or 0) - len(recent)
            limits.cut_run(s, run, family, members, recent)  # at most N jobs per cycle
            return run, False

    def run_jobs(self, run: Run, family_name: str) -> list[PendingJob]:
        """Every job of ``run`` with no committed result, with its attempts so far in it."""
        jobs: list[PendingJob] = []
        after: tuple[int, int] | None = None
        while True:
            window = self.run_window(run, family_name, WHOLE_WINDOW, after)
            jobs += window.jobs
            if window.next_after is None:
                return jobs
            after = window.next_after

    def run_window(
        self,
        run: Run,
        family_name: str,
        size: int,
        after: tuple[int, int] | None = None,
        also: Collection[int] = (),
        leave: Collection[int] = (),
        logged: bool = True,
    ) -> RunWindow:
        """The next ``size`` members of ``run`` in its order (oldest due first) after
        ``after``, those of them with no committed result as jobs (their attempts so far
        in the run with them), and where the window after this one starts.

        A run is read in windows so that a master holds a window's jobs, not all of a
        million-job run's: members do not change while a run is open, and their order
        key (last run, id) is unique, so windows read each member once. ``also``: ids of
        members to read in this window wherever they are in the order (a resumed run's
        jobs in flight), ``leave``: ids read before that way, left out here.
        ``logged`` false: no member of this window can have an execution in the run yet
        (a run this master opened, read window by window), so the log is not asked.
        """
        with self.engine.connect() as conn:
            members = select(
                Job.id,
                Job.key,
                Job.payload,
                Job.priority,
                Job.permanent_node_id,
                Job.trial_node_id,
                *budgets.oldest_due(),
            ).where(*_member_filter(run))
            rows = _members_after(conn, members, run, after, size)
            next_after = (int(rows[-1][-2]), int(rows[-1][-1])) if len(rows) == size else None
            wanted = sorted(set(also) - {row[0] for row in rows})
            for start in range(0, len(wanted), CHUNK):
                rows = [
                    *rows,
                    *conn.execute(members.where(Job.id.in_(wanted[start : start + CHUNK]))).all(),
                ]
            done: set[int] = set()
            failed_on: dict[int, list[int]] = {}
            if logged:
                # Read apart and left out here, not with NOT EXISTS in the members' query:
                # right after jobs were added (no statistics yet) PostgreSQL planned that
                # anti-join as a nested loop, 8 s for 20,000 jobs on resume.
                ids = [row[0] for row in rows]
                for start in range(0, len(ids), CHUNK):
                    for job_id, node_id, state in conn.execute(
                        select(Execution.job_id, Execution.node_id, Execution.state).where(
                            Execution.run_id == run.id,
                            Execution.state.in_((ExecState.DONE, ExecState.FAILED)),
                            Execution.job_id.in_(ids[start : start + CHUNK]),
                        )
                    ):
                        if state == ExecState.DONE:
                            done.add(job_id)
                        else:
                            failed_on.setdefault(job_id, []).append(node_id)
            out = _too_recent(conn, run) | done | set(leave)
            # Positional, in the fields' order (claim last): by keyword a job took 1.1 µs
            # against 0.4, for every member of every window. The run's id read once: a
            # mapped attribute costs a descriptor call a read.
            run_id = run.id
            jobs = [
                PendingJob(
                    job_id,
                    key,
                    family_name,
                    payload,
                    priority,
                    run_id,
                    home,
                    trial,
                    len(failed_on.get(job_id, ())),
                    frozenset(failed_on[job_id]) if job_id in failed_on else NO_NODES,
                    None,
                )
                for job_id, key, payload, priority, home, trial, _n, _id in rows
                if job_id not in out
            ]
            return RunWindow(jobs, next_after)

    def sent_executions(self, run_ids: Sequence[int | None]) -> list[Sent]:
        """Executions of open dispatches of these runs (None: on-demand) with no outcome."""
        ids = [r for r in run_ids if r is not None]
        cond: Any = Dispatch.run_id.in_(ids)
        if None in run_ids:
            cond = or_(cond, Dispatch.run_id.is_(None))
        with self.engine.connect() as conn:
            sent = [
                Sent(
                    exec_id=exec_id,
                    job_id=job_id,
                    node_id=node_id,
                    attempt=attempt,
                    dispatch_id=did,
                    sent_at=sent_at,
                    run_id=run_id,
                )
                for did, run_id, node_id, sent_at, items in conn.execute(
                    select(
                        Dispatch.id,
                        Dispatch.run_id,
                        Dispatch.node_id,
                        Dispatch.sent_at,
                        Dispatch.items,
                    ).where(Dispatch.is_open, cond)
                )
                for exec_id, job_id, attempt in json.loads(items)
            ]
            resolved: set[int] = set()
            all_ids = [x.exec_id for x in sent]
            for start in range(0, len(all_ids), 5000):
                resolved.update(
                    conn.scalars(
                        select(Execution.id).where(Execution.id.in_(all_ids[start : start + 5000]))
                    )
                )
        return [x for x in sent if x.exec_id not in resolved]

    def running_runs(self) -> int:
        """How many runs are open now (for metrics)."""
        with self.engine.connect() as conn:
            return int(conn.scalar(select(func.count()).where(Run.state == RunState.RUNNING)) or 0)

    def run_progress(self, run_id: int, done: int, failed: int, dead: int) -> None:
        """Record an open run's counts so far (for ``jodl status`` while it runs)."""
        with self.engine.begin() as conn:
            conn.execute(
                update(Run)
                .where(Run.id == run_id, Run.state == RunState.RUNNING)  # a closed run's are final
                .values(jobs_done=done, jobs_failed=failed, jobs_dead=dead)
            )

    def record_progress(self, rows: Sequence[ProgressRow]) -> None:
        """The running executions' newest progress reports, in one transaction (each
        replaces the execution's previous one); reports older than a day go too (those
        of on-demand jobs, which no run end clears)."""
        if not rows:
            return
        with self.engine.begin() as conn:
            conn.execute(
                delete(JobProgress).where(
                    or_(
                        JobProgress.exec_id.in_([r.exec_id for r in rows]),
                        JobProgress.reported_at < utcnow() - PROGRESS_KEPT,
                    )
                )
            )
            conn.execute(insert(JobProgress), [r._asdict() for r in rows])

    def set_unserved(self, run_id: int, why: str | None) -> None:
        """Record why no live agent runs an open run's jobs now (None: one does)."""
        with self.engine.begin() as conn:
            conn.execute(update(Run).where(Run.id == run_id).values(unserved=why))

    def count_run(self, run_id: int) -> tuple[int, int]:
        """(jobs with a committed result, failed executions) of a run, from the log."""
        with self.engine.connect() as conn:
            done = conn.scalar(
                select(func.count()).where(
                    Execution.run_id == run_id, Execution.state == ExecState.DONE
                )
            )
            failed = conn.scalar(
                select(func.count()).where(
                    Execution.run_id == run_id, Execution.state == ExecState.FAILED
                )
            )
            return int(done or 0), int(failed or 0)

    def finish_run(
        self,
        run: Run,
        makespan: float | None,
        lower_bound: float | None,
        state: str = RunState.FINISHED,
    ) -> Run:
        """Close the run: counts, makespan, jobs' last run (learning came with each outcome).

        ``state`` :data:`RunState.CANCELLED`: it ends before its jobs did (``jodl run
        cancel``); those without a result stay due for the next run.
        """
        now = utcnow()
        with self.sessions() as s, s.begin():
            # Only jobs that run every N cycles or not more often than T need to know
            # when they last ran; the others are due in every run. Most families have
            # none: a look at the partial index spares the join with the run's log.
            frequent = (
                Job.family_id == run.family_id,
                # literal 1: the planner matches it to the partial ix_jodl_job_frequency
                or_(Job.every_n_cycles > literal_column("1"), Job.min_interval.is_not(None)),
            )
            if s.scalar(select(Job.id).where(*frequent).limit(1)) is not None:
                done_here = exists().where(
                    Execution.run_id == run.id,
                    Execution.job_id == Job.id,
                    Execution.state == ExecState.DONE,
                )
                s.execute(
                    update(Job)
                    .where(*frequent, done_here)
                    .values(last_run_number=run.number, last_done_at=now)
                    .execution_options(synchronize_session=False)
                )
            s.execute(
                update(Dispatch)
                .where(Dispatch.run_id == run.id, Dispatch.is_open)
                .values(is_open=False)
            )
            s.execute(delete(JobProgress).where(JobProgress.run_id == run.id))
            counts: dict[str, int] = {
                state: count
                for state, count in s.execute(
                    select(Execution.state, func.count())
                    .where(
                        Execution.run_id == run.id,
                        Execution.state.in_((ExecState.DONE, ExecState.FAILED)),
                    )
                    .group_by(Execution.state)
                )
            }
            db_run = s.get(Run, run.id)
            assert db_run is not None
            limits.after_run(s, db_run)
            db_run.jobs_done = counts.get(ExecState.DONE, 0)
            db_run.jobs_failed = counts.get(ExecState.FAILED, 0)
            db_run.jobs_dead = (
                s.scalar(
                    select(func.count()).where(Job.run_id == run.id, Job.state == JobState.DEAD)
                )
                or 0
            )
            db_run.state = state
            db_run.finished_at = now
            db_run.makespan = makespan
            db_run.lower_bound = lower_bound
            db_run.ratio = makespan_ratio(makespan, lower_bound)
            s.flush()
            return db_run

    def results(self, family: str, run: int | None = None) -> RunResults:
        """What run number ``run`` of ``family`` (default: its newest) gave, per job.

        A job with a committed result is ``done`` with it; otherwise its newest
        attempt's state (``failed``, ``lost``, ...) and error; ``dead`` when the run
        gave up on it. Jobs without any attempt yet are not listed.
        """
        with self.sessions() as s:
            query = (
                select(Run)
                .join(FamilyRow, FamilyRow.id == Run.family_id)
                .where(FamilyRow.name == family)
            )
            if run is not None:
                query = query.where(Run.number == run)
            found = s.scalar(query.order_by(Run.number.desc()).limit(1))
            if found is None:
                which = f"run {run} of {family!r}" if run is not None else f"{family!r} has no run"
                raise JodlError(f"no results: {which} (see `jodl status`)")
            rows = s.execute(
                select(Job.key, Job.state, Execution.state, Execution.result, Execution.error)
                .join(Job, Job.id == Execution.job_id)
                .where(Execution.run_id == found.id)
                .order_by(Execution.id)
            ).all()
        by_key: dict[str, JobResult] = {}
        for key, job_state, state, result, error in rows:
            if key in by_key and by_key[key].state == ExecState.DONE:
                continue  # one committed result per job per run; later rows are late copies
            if state == ExecState.DONE:
                by_key[key] = JobResult(key, state, json.loads(result) if result else None, None)
            else:
                dead = job_state == JobState.DEAD and found.state != RunState.RUNNING
                by_key[key] = JobResult(key, "dead" if dead else state, None, error)
        jobs = [by_key[key] for key in sorted(by_key)]
        return RunResults(family, found.number, found.state, jobs)

    def running_families(self) -> list[str]:
        """Names of the families with an unfinished run, by name."""
        with self.engine.connect() as conn:
            return sorted(
                conn.scalars(
                    select(FamilyRow.name)
                    .join(Run, Run.family_id == FamilyRow.id)
                    .where(Run.state == RunState.RUNNING)
                    .distinct()
                )
            )

    def running_run(self, family: str) -> Run | None:
        """The family's unfinished run, if any."""
        with self.sessions() as s:
            return s.scalar(
                select(Run)
                .join(FamilyRow, FamilyRow.id == Run.family_id)
                .where(FamilyRow.name == family, Run.state == RunState.RUNNING)
                .order_by(Run.number.desc())
                .limit(1)
            )

    def ended_since(self, family: str, since: dt.datetime) -> Run | None:
        """The family's last run that ended at or after ``since``, if any."""
        with self.sessions() as s:
            return s.scalar(
                select(Run)
                .join(FamilyRow, FamilyRow.id == Run.family_id)
                .where(FamilyRow.name == family, Run.finished_at >= since)
                .order_by(Run.number.desc())
                .limit(1)
            )


def _members_after(
    conn: Any, members: Select[Any], run: Run, after: tuple[int, int] | None, size: int
) -> list[Any]:
    """The next ``size`` rows of ``members`` (whose last two columns are the order key,
    :func:`budgets.oldest_due`) after ``after``, in that order.

    Read one last run at a time, each in id ranges: one ``ORDER BY`` of the key with a
    ``LIMIT`` was a scan and sort of every member per window, 250 ms a window of a
    million-job run (25 s of its 116 s cycle), and no index serves that order without
    making the per-cycle update of ``last_run_number`` rewrite every index of a job
    (:func:`budgets.ran_in` keeps those updates HOT). A range of ids is bounded work,
    read by the primary key whatever the statistics say (:mod:`.plans`); a range
    with no member doubles the next one, so sparse members cost a few more statements,
    not one each. The next last run is found by one scan of
    the members per distinct value: two per run, usually (never run, or all last).
    """
    number_of = budgets.oldest_due()[0]
    filters = _member_filter(run)
    top = run.max_job_id or 0
    if after is None:
        number, last = _next_number(conn, filters, None)
    else:
        number, last = after
    rows: list[Any] = []
    span = size
    while number is not None and len(rows) < size:
        if last >= top:
            number, last = _next_number(conn, filters, number)
            span = size
            continue
        end = min(top, last + span)
        # No bitmap scan: the read walks the primary key through its range alone.
        # Without statistics (right after a bulk add) the planner ANDed the range with a
        # bitmap of the family's every job from its key index: 45-55 ms a read of
        # 10,000 on a million-job family, 5-11 ms by the key (4 s of such a cycle, in
        # the master's loop). Put back after it: the window's other reads keep theirs.
        with plans.scoped(conn, enable_bitmapscan="off"):
            part = conn.execute(
                members.where(number_of == number, Job.id > last, Job.id <= end)
                .order_by(Job.id)
                .limit(size - len(rows))
            ).all()
        rows += part
        last = int(part[-1][0]) if len(rows) == size else end
        span = span * 2 if not part else size
    return rows


def _next_number(conn: Any, filters: tuple[Any, ...], after: int | None) -> tuple[int | None, int]:
    """The members' next last run after ``after`` (None: the first), and the id a read
    of its members starts after; (None, 0) when no member has a later one."""
    number_of = budgets.oldest_due()[0]
    where = filters if after is None else (*filters, number_of > after)
    found = conn.execute(
        select(number_of, func.min(Job.id))
        .where(*where)
        .group_by(number_of)
        .order_by(number_of)
        .limit(1)
    ).first()
    if found is None:
        return None, 0
    return int(found[0]), int(found[1]) - 1


def _member_filter(run: Run) -> tuple[Any, ...]:
    """Jobs due in ``run``: idle, older than the run, due by their every-N-cycles, and
    not held back by a due time after the run's start (``Job.due_at``, see
    :meth:`JobLog.set_due <jodl.log.jobs.JobLog.set_due>`)."""
    return (
        Job.family_id == run.family_id,
        Job.state == JobState.IDLE,
        Job.id <= (run.max_job_id or 0),
        or_(
            Job.last_run_number.is_(None),
            run.number - Job.last_run_number >= Job.every_n_cycles,
        ),
        or_(Job.due_at.is_(None), Job.due_at <= run.started_at),
        *budgets.member_cut(run),
    )


def _too_recent(s: Session | Any, run: Run) -> set[int]:
    """Jobs excluded by "not more often than T" when the run opened (few have a T)."""
    return {
        job_id
        for job_id, last, interval in s.execute(
            select(Job.id, Job.last_done_at, Job.min_interval).where(
                Job.family_id == run.family_id,
                Job.min_interval.is_not(None),
                Job.last_done_at.is_not(None),
            )
        )
        if last + dt.timedelta(seconds=interval) > run.started_at
    }
