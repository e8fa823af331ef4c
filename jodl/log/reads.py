"""What applications and operators read from the log, without knowing its tables.

Applications (the page checker, the web UI) and ``jodl status`` read the library's
tables only through these methods, so the schema can change behind them.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, and_, exists, func, literal_column, or_, select
from sqlalchemy.orm import sessionmaker

from .models import (
    ExecState,
    Execution,
    FamilyRow,
    Job,
    JobProgress,
    JobState,
    Node,
    Run,
    RunState,
)
from .nodes import OPS_LABEL
from .records import (
    DoneResult,
    ExecutionView,
    FailedAttempt,
    FamilyResult,
    JobError,
    JobTiming,
    RunningJob,
)
from .runs import makespan_ratio

#: Ids per ``IN (...)`` list.
CHUNK = 500
#: Characters of a result or an error a listing of executions shows (the API's results
#: endpoints give whole results).
SHOWN_CHARS = 300
#: Executions one page of a run's listing holds at most.
MAX_PAGE = 500


class Reads:
    """Views of the log for applications, the CLI and the web API.

    Methods that take ``conn`` run inside the caller's transaction (an application
    that changes its own tables and the log's jobs at once); the others open
    their own connection.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)

    def overview(self, runs: int = 10) -> dict[str, Any]:
        """Nodes, families with job counts per state, and the ``runs`` newest runs."""
        with self.sessions() as s:
            nodes = [
                {
                    "id": n.id,
                    "address": n.address,
                    "state": n.state,
                    "slots": n.slots,
                    "speed": n.speed,
                    "last_seen": n.last_seen,
                    "ops": (n.labels or {}).get(OPS_LABEL),
                    "last_error": n.last_error,
                    "families": sorted(n.families or {}),
                    "reload_asked": n.reload_asked_at is not None,
                }
                for n in s.scalars(select(Node).order_by(Node.id))
            ]
            counts: dict[int, dict[str, int]] = {}
            for fam_id, state, count in s.execute(
                select(Job.family_id, Job.state, func.count()).group_by(Job.family_id, Job.state)
            ):
                counts.setdefault(fam_id, {})[state] = count
            families = [
                {"id": f.id, "name": f.name, "strategy": f.strategy, "jobs": counts.get(f.id, {})}
                for f in s.scalars(select(FamilyRow).order_by(FamilyRow.name))
            ]
            names = {f["id"]: f["name"] for f in families}
            recent: list[dict[str, Any]] = [
                {
                    "id": r.id,
                    "family": names.get(r.family_id, "?"),
                    "number": r.number,
                    "state": r.state,
                    "started_at": r.started_at,
                    "finished_at": r.finished_at,
                    "jobs_total": r.jobs_total,
                    "jobs_done": r.jobs_done,
                    "jobs_failed": r.jobs_failed,
                    "jobs_dead": r.jobs_dead,
                    "makespan": r.makespan,
                    "lower_bound": r.lower_bound,
                    # Recomputed: rows written before the rule have 483s and 0.82s.
                    "ratio": makespan_ratio(r.makespan, r.lower_bound),
                    "unserved": r.unserved,
                }
                for r in s.scalars(select(Run).order_by(Run.id.desc()).limit(runs))
            ]
        for run in recent:  # the few running runs: how far their long jobs are
            if run["state"] == RunState.RUNNING:
                run["progress"] = [p._asdict() for p in self.running_jobs(run["id"], 5)]
        return {"nodes": nodes, "families": families, "runs": recent}

    # -- runs --------------------------------------------------------------------------------

    def run(self, run_id: int) -> Run | None:
        """The run with this id."""
        with self.sessions() as s:
            return s.get(Run, run_id)

    def family_of_run(self, run_id: int) -> str | None:
        """The name of the family a run belongs to."""
        with self.engine.connect() as conn:
            return conn.scalar(
                select(FamilyRow.name)
                .join(Run, Run.family_id == FamilyRow.id)
                .where(Run.id == run_id)
            )

    def newest_run_number(self, family: str) -> int | None:
        """The number of the family's newest run (None: it has none)."""
        with self.engine.connect() as conn:
            return conn.scalar(
                select(func.max(Run.number))
                .join(FamilyRow, FamilyRow.id == Run.family_id)
                .where(FamilyRow.name == family)
            )

    def outcome_counts(self, run_ids: Sequence[int]) -> dict[int, dict[str, int]]:
        """Per run, how many executions ended in each state (live progress of open runs)."""
        out: dict[int, dict[str, int]] = {}
        if not run_ids:
            return out
        with self.engine.connect() as conn:
            for run_id, state, count in conn.execute(
                select(Execution.run_id, Execution.state, func.count())
                .where(Execution.run_id.in_(list(run_ids)))
                .group_by(Execution.run_id, Execution.state)
            ):
                out.setdefault(run_id, {})[state] = int(count)
        return out

    def failed_attempts(self, run_id: int, limit: int) -> list[FailedAttempt]:
        """A run's attempts that ended with an error, newest first, at most ``limit``."""
        with self.engine.connect() as conn:
            return [
                FailedAttempt(*row)
                for row in conn.execute(
                    select(
                        Job.key, Execution.attempt, Node.address, Execution.state, Execution.error
                    )
                    .join(Job, Job.id == Execution.job_id)
                    .outerjoin(Node, Node.id == Execution.node_id)
                    .where(Execution.run_id == run_id, Execution.error.is_not(None))
                    .order_by(Execution.id.desc())
                    .limit(limit)
                )
            ]

    def run_executions(
        self,
        run_id: int,
        *,
        state: str | None = None,
        key: str | None = None,
        after: int = 0,
        limit: int = 50,
    ) -> list[ExecutionView]:
        """One page of a run's attempts in the order they were logged: those after
        execution ``after`` (keyset paging, as cheap on page 2,000 as on page 1), of one
        ``state`` and with ``key`` in their job's key when given."""
        shown = (
            func.substr(Execution.result, 1, SHOWN_CHARS),
            func.substr(Execution.error, 1, SHOWN_CHARS),
        )
        query = (
            select(
                Execution.id, Job.key, Node.address, Execution.attempt, Execution.state,
                Execution.backup, Execution.sent_at, Execution.finished_at, Execution.duration,
                *shown,
            )
            .join(Job, Job.id == Execution.job_id)
            .outerjoin(Node, Node.id == Execution.node_id)
            .where(Execution.run_id == run_id, Execution.id > after)
            .order_by(Execution.id)
            .limit(max(1, min(limit, MAX_PAGE)))
        )  # fmt: skip
        if state is not None:
            query = query.where(Execution.state == state)
        if key:
            escaped = key.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            query = query.where(Job.key.like(f"%{escaped}%", escape="\\"))
        with self.engine.connect() as conn:
            return [ExecutionView(*row) for row in conn.execute(query)]

    def running_jobs(self, run_id: int, limit: int = 50) -> list[RunningJob]:
        """A run's jobs that are running and said how far they are, newest report first."""
        ended = exists().where(Execution.id == JobProgress.exec_id)
        query = (
            select(
                Job.key, Node.address, JobProgress.done, JobProgress.total, JobProgress.note,
                JobProgress.reported_at,
            )
            .join(Job, Job.id == JobProgress.job_id)
            .outerjoin(Node, Node.id == JobProgress.node_id)
            .where(JobProgress.run_id == run_id, ~ended)
            .order_by(JobProgress.reported_at.desc())
            .limit(max(1, min(limit, MAX_PAGE)))
        )  # fmt: skip
        with self.engine.connect() as conn:
            return [RunningJob(*row) for row in conn.execute(query)]

    def job_timings(self, job_ids: Sequence[int]) -> dict[int, JobTiming]:
        """job id -> its every-N-cycles and last run, for those of these jobs not deleted."""
        out: dict[int, JobTiming] = {}
        with self.engine.connect() as conn:
            for start in range(0, len(job_ids), CHUNK):
                for row in conn.execute(
                    select(Job.id, Job.every_n_cycles, Job.last_run_number).where(
                        Job.id.in_(list(job_ids[start : start + CHUNK])),
                        Job.state != JobState.DELETED,
                    )
                ):
                    out[row[0]] = JobTiming(*row)
        return out

    def results_since(
        self, run_id: int, after: int, limit: int, conn: Connection | None = None
    ) -> list[DoneResult]:
        """Up to ``limit`` committed results of a run with execution ids above ``after``
        (a cursor: pass the last id seen), in id order."""
        query = (
            select(Execution.id, Execution.job_id, Execution.result, Execution.finished_at)
            .where(
                Execution.run_id == run_id,
                Execution.state == ExecState.DONE,
                Execution.id > after,
            )
            .order_by(Execution.id)
            .limit(limit)
        )
        if conn is not None:
            return [DoneResult(*row) for row in conn.execute(query)]
        with self.engine.connect() as own:
            return [DoneResult(*row) for row in own.execute(query)]

    def family_results(self, family: str, after: int, limit: int) -> list[FamilyResult]:
        """Up to ``limit`` committed results of ``family``'s jobs (of every run, and
        on demand) with execution ids above ``after`` (a cursor: pass the last id
        seen), in id order."""
        query = (
            select(Execution.id, Job.key, Run.number, Execution.result, Execution.finished_at)
            .join(Job, Job.id == Execution.job_id)
            .join(FamilyRow, FamilyRow.id == Job.family_id)
            .outerjoin(Run, Run.id == Execution.run_id)
            .where(
                FamilyRow.name == family,
                Execution.state == ExecState.DONE,
                Execution.id > after,
            )
            .order_by(Execution.id)
            .limit(max(1, min(limit, MAX_PAGE)))
        )
        with self.engine.connect() as conn:
            return [FamilyResult(*row) for row in conn.execute(query)]

    def dead_in_run(self, run_id: int, conn: Connection | None = None) -> dict[int, str | None]:
        """job id -> last error of the jobs a run gave up on (failed every attempt)."""
        query = select(Job.id, Job.last_error).where(
            Job.run_id == run_id, Job.state == JobState.DEAD
        )
        if conn is not None:
            return dict(conn.execute(query).tuples().all())
        with self.engine.connect() as own:
            return dict(own.execute(query).tuples().all())

    # -- jobs ------------------------------------------------------------------------------------

    def jobs_by_key(
        self, family_id: int, keys: Sequence[str], conn: Connection | None = None
    ) -> dict[str, tuple[int, str]]:
        """key -> (job id, state) of the family's jobs with these keys."""
        found: dict[str, tuple[int, str]] = {}

        def read(c: Connection) -> None:
            for start in range(0, len(keys), CHUNK):
                for jid, key, state in c.execute(
                    select(Job.id, Job.key, Job.state).where(
                        Job.family_id == family_id, Job.key.in_(keys[start : start + CHUNK])
                    )
                ):
                    found[key] = (jid, state)

        if conn is not None:
            read(conn)
        else:
            with self.engine.connect() as own:
                read(own)
        return found

    def next_due(self, family: str) -> dt.datetime | None:
        """The earliest due time among the family's idle jobs that have one (naive
        UTC), None when none has; jobs without a due time are due in any run and do
        not count here. One look at a partial index (``ix_jodl_job_idle_due``)."""
        with self.engine.connect() as conn:
            return conn.scalar(
                select(func.min(Job.due_at))
                .join(FamilyRow, FamilyRow.id == Job.family_id)
                .where(
                    FamilyRow.name == family,
                    Job.state == literal_column(f"'{JobState.IDLE}'"),
                    Job.due_at.is_not(None),
                )
            )

    def due_times(self, job_ids: Sequence[int]) -> dict[int, dt.datetime | None]:
        """job id -> its due time (None: due in any run), for those of these jobs idle."""
        out: dict[int, dt.datetime | None] = {}
        with self.engine.connect() as conn:
            for start in range(0, len(job_ids), CHUNK):
                for job_id, due in conn.execute(
                    select(Job.id, Job.due_at).where(
                        Job.id.in_(list(job_ids[start : start + CHUNK])),
                        Job.state == JobState.IDLE,
                    )
                ):
                    out[job_id] = due
        return out

    def idle_jobs(self, family_id: int, conn: Connection) -> set[int]:
        """Ids of the family's idle jobs (those its next cycle may run)."""
        return set(
            conn.scalars(
                select(Job.id).where(Job.family_id == family_id, Job.state == JobState.IDLE)
            )
        )

    def given_up(self, job_ids: Iterable[int]) -> list[JobError]:
        """Of these jobs, those dead (failed too often) or deleted, with their last error."""
        ids = list(job_ids)
        out: list[JobError] = []
        with self.engine.connect() as conn:
            for start in range(0, len(ids), CHUNK):
                out += [
                    JobError(*row)
                    for row in conn.execute(
                        select(Job.id, Job.state, Job.last_error).where(
                            Job.id.in_(ids[start : start + CHUNK]),
                            Job.state.in_((JobState.DEAD, JobState.DELETED)),
                        )
                    )
                ]
        return out

    # -- results of jobs (the on-demand result cache) -----------------------------------------

    def latest_results(
        self, job_ids: Sequence[int], keep: int = 2
    ) -> dict[int, list[tuple[int, dt.datetime | None]]]:
        """Per job its ``keep`` newest committed results: (execution id, finished), newest first."""
        out: dict[int, list[tuple[int, dt.datetime | None]]] = {}
        with self.engine.connect() as conn:
            for start in range(0, len(job_ids), CHUNK):
                chunk = job_ids[start : start + CHUNK]
                ranked = (
                    select(
                        Execution.job_id,
                        Execution.id,
                        Execution.finished_at,
                        func.row_number()
                        .over(partition_by=Execution.job_id, order_by=Execution.id.desc())
                        .label("n"),
                    )
                    .where(Execution.job_id.in_(chunk), Execution.state == ExecState.DONE)
                    .subquery()
                )
                for jid, eid, finished in conn.execute(
                    select(ranked.c.job_id, ranked.c.id, ranked.c.finished_at)
                    .where(ranked.c.n <= keep)
                    .order_by(ranked.c.job_id, ranked.c.id.desc())
                ):
                    out.setdefault(jid, []).append((eid, finished))
        return out

    def newest_exec_ids(self, job_ids: Sequence[int]) -> dict[int, int]:
        """job id -> its newest execution id (any outcome), for jobs that have one."""
        out: dict[int, int] = {}
        with self.engine.connect() as conn:
            for start in range(0, len(job_ids), CHUNK):
                out.update(
                    conn.execute(
                        select(Execution.job_id, func.max(Execution.id))
                        .where(Execution.job_id.in_(job_ids[start : start + CHUNK]))
                        .group_by(Execution.job_id)
                    )
                    .tuples()
                    .all()
                )
        return out

    def result_texts(self, exec_ids: Iterable[int]) -> dict[int, str | None]:
        """execution id -> its result (JSON text, as the family returned it)."""
        return self._by_exec_id(Execution.result, exec_ids)

    def finished_at(self, exec_ids: Iterable[int]) -> dict[int, dt.datetime | None]:
        """execution id -> when it finished."""
        return self._by_exec_id(Execution.finished_at, exec_ids)

    def results_after(self, floors: Mapping[int, Sequence[int]]) -> list[DoneResult]:
        """Committed results of jobs above a floor: ``floors`` maps an execution id to the
        jobs whose results above it are wanted. In the order the agents finished them
        (results committed together), then by id. One query."""
        if not floors:
            return []
        condition = or_(
            *(
                and_(Execution.job_id.in_(list(jids)), Execution.id > after)
                for after, jids in floors.items()
            )
        )
        with self.engine.connect() as conn:
            return [
                DoneResult(*row)
                for row in conn.execute(
                    select(Execution.id, Execution.job_id, Execution.result, Execution.finished_at)
                    .where(Execution.state == ExecState.DONE, condition)
                    .order_by(Execution.finished_at, Execution.id)
                )
            ]

    def _by_exec_id(self, column: Any, exec_ids: Iterable[int]) -> dict[int, Any]:
        ids = sorted(set(exec_ids))
        out: dict[int, Any] = {}
        if not ids:
            return out  # not even a connection (a pool pre-ping is a round trip)
        with self.engine.connect() as conn:
            for start in range(0, len(ids), CHUNK):
                out.update(
                    conn.execute(
                        select(Execution.id, column).where(
                            Execution.id.in_(ids[start : start + CHUNK])
                        )
                    )
                    .tuples()
                    .all()
                )
        return out
