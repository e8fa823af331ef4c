"""Every statement of the on-demand queue, one named method each (:class:`QueueSQL`).

The queue lives in the job table (``jodl_job``): a job of the queue is a row in
state queued, claimed, done or dead, its claim an attempt number and a lease.
:class:`jodl.queue.Queue` decides (due times, retries, waiting); this gateway
holds the SQL, opens the transactions and builds the records it returns
(:class:`Claimed`, :class:`QueuedJob`). The claim is the hot path: one statement
per claim (``FOR UPDATE SKIP LOCKED`` on PostgreSQL, one ``UPDATE ... RETURNING``
on SQLite), enqueues of any size are one statement too.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    case,
    func,
    insert,
    literal_column,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.exc import IntegrityError

from . import bulk, plans
from .exec_ids import ExecIds
from .limits import HourlyBudgets
from .listener import CHANNEL
from .models import ExecState, Execution, FamilyRow, Job, JobState, utcnow
from .notices import begin
from .outcomes import close_claims
from .queue_records import QUEUE_STATES, Claimed, QueuedJob
from .queue_upsert import UPSERT_SQLITE, UPSERT_UNNEST
from .records import EXEC_COLUMNS

#: Rows per statement when a batch is split (bind-parameter limits).
CHUNK = 1000
#: On PostgreSQL, (job_id, attempt) claims as rows of two arrays, in one statement of any
#: size. ``(id, attempts) IN`` a list of 1,000 pairs took 70 ms a statement, planning
#: and compiling it most of that: a serving master checks the claims it holds every
#: second, from its loop (``bench/ondemand.py``).
CLAIMS = "unnest(CAST(:ids AS BIGINT[]), CAST(:attempts AS INTEGER[])) AS c(id, attempt)"
HELD = f"j.id = c.id AND j.attempts = c.attempt AND j.state = '{JobState.CLAIMED}'"


def _claim_arrays(pairs: Sequence[tuple[int, int]]) -> dict[str, str]:
    return {
        "ids": bulk.int_array([p[0] for p in pairs]),
        "attempts": bulk.int_array([p[1] for p in pairs]),
    }


class QueueSQL:
    """The on-demand queue's statements over one engine (and its family-name cache)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.postgres = engine.dialect.name == "postgresql"
        self._family_ids: dict[str, int] = {}
        self._family_names: dict[int, str] = {}
        self._ids_lock = threading.Lock()
        self._ids: ExecIds | None = None
        #: Per-hour budgets of families' on-demand jobs (jodl/admin/budget.py).
        self.hourly = HourlyBudgets(engine)

    # -- families ------------------------------------------------------------------------------

    def _load_families(self) -> None:
        with self.engine.connect() as conn:
            for fid, name in conn.execute(select(FamilyRow.id, FamilyRow.name)):
                self._family_ids[name] = fid
                self._family_names[fid] = name

    def family_id(self, name: str, create: bool = False) -> int | None:
        """The id of family ``name`` (created when ``create``), None if there is none."""
        fid = self._family_ids.get(name)
        if fid is not None:
            return fid
        self._load_families()
        if name not in self._family_ids and create:
            try:
                with self.engine.begin() as conn:
                    conn.execute(insert(FamilyRow).values(name=name))
            except IntegrityError:
                pass  # created meanwhile by another process
            self._load_families()
        return self._family_ids.get(name)

    def family_name(self, fid: int) -> str:
        """The name of family ``fid``."""
        if fid not in self._family_names:
            self._load_families()
        return self._family_names[fid]

    # -- enqueue -------------------------------------------------------------------------------

    def enqueue(
        self,
        fid: int,
        family: str,
        payloads: dict[str, str],
        priority: int,
        due: dt.datetime,
        now: dt.datetime,
    ) -> dict[str, int]:
        """Upsert jobs (key -> payload text) of family ``fid`` and notify; key -> job id."""
        ids: dict[str, int] = {}
        with self.engine.begin() as conn:
            if self.postgres:
                # The batch travels as two arrays: one statement, one plan, any size.
                result = conn.execute(
                    UPSERT_UNNEST,
                    {
                        "fid": fid,
                        "prio": priority,
                        "due": due,
                        "now": now,
                        "keys": bulk.text_array(payloads),
                        "payloads": bulk.text_array(payloads.values()),
                    },
                )
            else:
                rows = [
                    {
                        "family_id": fid,
                        "key": key,
                        "payload": text_,
                        "priority": priority,
                        "state": JobState.QUEUED,
                        "due_at": due,
                        "every_n_cycles": 1,
                        "attempts": 0,
                        "failures": 0,
                        "created_at": now,
                        "updated_at": now,
                    }
                    for key, text_ in payloads.items()
                ]
                # executemany with RETURNING: multi-row INSERTs compiled once and cached.
                result = conn.execute(UPSERT_SQLITE, rows)
            for job_id, key in result:
                ids[key] = job_id
            self._notify(conn, family)
        return ids

    def _notify(self, conn: Connection, family: str) -> None:
        if self.postgres:
            # Delivered at commit, so a woken consumer sees the rows.
            conn.execute(
                text("SELECT pg_notify(:channel, :family)"), {"channel": CHANNEL, "family": family}
            )

    # -- claims --------------------------------------------------------------------------------

    def claim(
        self, limit: int, now: dt.datetime, until: dt.datetime, families: Sequence[str] | None
    ) -> list[Claimed]:
        """Claim up to ``limit`` due jobs (of the families named) until ``until``.

        Highest priority first, then earliest due; within the families' hourly
        budgets. The claims come back in that order (ties by id).
        """
        # The state as a literal, not a parameter: a prepared (generic) plan can then
        # still use the partial index of queued jobs (ix_jodl_job_queue).
        queued = Job.state == literal_column(f"'{JobState.QUEUED}'")
        due = select(Job.id).where(queued, Job.due_at <= now)
        if families is not None:
            due = due.where(_of_families(families))
        due = due.order_by(Job.priority.desc(), Job.due_at)

        def statement(extra: tuple[Any, ...], most: int) -> Any:
            picked = due.where(*extra).limit(most)
            if self.postgres:
                # Materialised once, locked rows skipped: concurrent claimers never wait.
                cte = (
                    picked.with_for_update(skip_locked=True).cte("due").prefix_with("MATERIALIZED")
                )
                chosen: Any = select(cte.c.id)
            else:
                chosen = picked  # one statement holds SQLite's write lock: atomic
            return (
                update(Job)
                .where(Job.id.in_(chosen))
                .values(
                    state=JobState.CLAIMED,
                    attempts=Job.attempts + 1,
                    lease_until=until,
                    due_at=None,
                    updated_at=now,
                )
                .returning(
                    Job.id,
                    Job.family_id,
                    Job.key,
                    Job.payload,
                    Job.priority,
                    Job.attempts,
                    Job.failures,
                    Job.permanent_node_id,
                    Job.trial_node_id,
                )
            )

        per_hour = self.hourly.per_hour()  # families with an on-demand budget (cached)
        rows: Sequence[Any]
        with self.engine.begin() as conn:
            # No plan with a sort: the due jobs are read in the queue index's order
            # (ix_jodl_job_queue) and the scan stops at the claim's limit. Left to the
            # statistics, a table with none (a burst of enqueues into a new or emptied
            # queue) got a bitmap scan of every queued job and a sort spilled to disk:
            # 45 ms to claim 1,800 jobs of 80,000, 17 ms in index order.
            plans.set_local(conn, enable_sort="off")
            if per_hour:
                rows = self.hourly.claim(
                    conn, per_hour, now, limit, lambda x, n: conn.execute(statement(x, n)).all()
                )
            else:
                rows = conn.execute(statement((), limit)).all()
        name = self.family_name
        out = [
            Claimed(job_id, name(fid), key, payload, prio, attempt, failures, until, home, trial)
            for job_id, fid, key, payload, prio, attempt, failures, home, trial in rows
        ]
        # By id, then by priority, highest first: a sort keeps the order of equal keys, so
        # ties stay by id; two sorts by a field in C, not one by a tuple built per claim.
        out.sort(key=attrgetter("id"))
        out.sort(key=attrgetter("priority"), reverse=True)
        return out

    def extend(self, pairs: Sequence[tuple[int, int]], until: dt.datetime) -> set[int]:
        """Move the leases of (job_id, attempt) claims to ``until``; the ids still claimed."""
        held: set[int] = set()
        with self.engine.begin() as conn:
            if self.postgres:
                sql = f"UPDATE jodl_job AS j SET lease_until = :until FROM {CLAIMS} WHERE {HELD}"
                params = {"until": until, **_claim_arrays(pairs)}
                return set(conn.scalars(text(sql + " RETURNING j.id"), params))
            for start in range(0, len(pairs), CHUNK):
                held.update(
                    conn.scalars(
                        update(Job)
                        .where(
                            tuple_(Job.id, Job.attempts).in_(pairs[start : start + CHUNK]),
                            Job.state == JobState.CLAIMED,
                        )
                        .values(lease_until=until)
                        .returning(Job.id)
                    )
                )
        return held

    def still_claimed(self, pairs: Sequence[tuple[int, int]]) -> set[int]:
        """Which (job_id, attempt) claims still hold their job (read only)."""
        held: set[int] = set()
        with self.engine.connect() as conn:
            if self.postgres:
                sql = f"SELECT j.id FROM jodl_job AS j, {CLAIMS} WHERE {HELD}"
                return set(conn.scalars(text(sql), _claim_arrays(pairs)))
            for start in range(0, len(pairs), CHUNK):
                held.update(
                    conn.scalars(
                        select(Job.id).where(
                            tuple_(Job.id, Job.attempts).in_(pairs[start : start + CHUNK]),
                            Job.state == JobState.CLAIMED,
                        )
                    )
                )
        return held

    # -- outcomes ------------------------------------------------------------------------------

    def complete(self, job_id: int, attempt: int, exec_id: int | None, result: str) -> bool:
        """End the claim ``attempt`` as done; with ``exec_id``, log ``result`` (JSON) as its
        execution row in the same transaction. False (and no change) if not held."""
        with begin(self.engine) as conn:
            failures = conn.scalar(
                select(Job.failures).where(
                    Job.id == job_id, Job.state == JobState.CLAIMED, Job.attempts == attempt
                )
            )
            if failures is None or not close_claims(conn, done=[(job_id, attempt)]):
                return False
            if exec_id is not None:
                now = utcnow()
                row: tuple[Any, ...] = (exec_id, None, job_id, None, failures + 1, ExecState.DONE)
                row += (False, 0, now, now, now, 0.0, result, None)
                table: Any = Execution.__table__
                bulk.copy_rows(conn, table, EXEC_COLUMNS, [row])
        return True

    def complete_many(self, claims: Sequence[tuple[int, int]]) -> int:
        """End many (job_id, attempt) claims as done in one transaction; how many were held."""
        with begin(self.engine) as conn:
            return close_claims(conn, done=list(claims))

    def fail(
        self,
        job_id: int,
        attempt: int,
        error: str,
        due_for: Callable[[int, int | None], dt.datetime | None],
    ) -> str | None:
        """End the claim ``attempt`` as failed: the job's new state, or None if not held.

        ``due_for(failures, family's max_attempts)`` gives when the job is due
        again, None making it dead.
        """
        with begin(self.engine) as conn:
            row = conn.execute(
                select(Job.failures, FamilyRow.max_attempts)
                .join(FamilyRow, FamilyRow.id == Job.family_id)
                .where(Job.id == job_id, Job.state == JobState.CLAIMED, Job.attempts == attempt)
            ).first()
            if row is None:
                return None
            due = due_for(row[0] + 1, row[1])
            if not close_claims(conn, failed=[(job_id, attempt, error, due)]):
                return None
        return JobState.DEAD if due is None else JobState.QUEUED

    def release(self, pairs: Sequence[tuple[int, int]], now: dt.datetime) -> int:
        """Queue (job_id, attempt) claims again with no failure counted; how many held."""
        count = 0
        with self.engine.begin() as conn:
            if self.postgres:
                sql = (
                    f"UPDATE jodl_job AS j SET state = '{JobState.QUEUED}',"
                    " due_at = coalesce(j.due_at, :now), lease_until = NULL, updated_at = :now"
                    f" FROM {CLAIMS} WHERE {HELD}"
                )
                count = conn.execute(text(sql), {"now": now, **_claim_arrays(pairs)}).rowcount
            else:
                for start in range(0, len(pairs), CHUNK):
                    count += conn.execute(
                        update(Job)
                        .where(
                            tuple_(Job.id, Job.attempts).in_(pairs[start : start + CHUNK]),
                            Job.state == JobState.CLAIMED,
                        )
                        .values(
                            state=JobState.QUEUED,
                            due_at=func.coalesce(Job.due_at, now),
                            lease_until=None,
                            updated_at=now,
                        )
                    ).rowcount
            if count:
                self._notify(conn, "")
        return int(count)

    def release_expired(self, now: dt.datetime, max_attempts: int) -> int:
        """Queue again (or kill) claimed jobs whose lease ended before ``now``, counting a
        failure each (``max_attempts`` for families that set none); how many."""
        limit = func.coalesce(
            select(FamilyRow.max_attempts).where(FamilyRow.id == Job.family_id).scalar_subquery(),
            max_attempts,
        )
        stmt = (
            update(Job)
            .where(Job.state == JobState.CLAIMED, Job.lease_until < now)
            .values(
                state=case((Job.failures + 1 >= limit, JobState.DEAD), else_=JobState.QUEUED),
                # An enqueue made while it ran keeps its due time; else due at once.
                due_at=func.coalesce(Job.due_at, now),
                failures=Job.failures + 1,
                lease_until=None,
                last_error="lease ended before the result was committed",
                updated_at=now,
            )
            .execution_options(synchronize_session=False)
        )
        with self.engine.begin() as conn:
            count = conn.execute(stmt).rowcount
            if count:
                self._notify(conn, "")
        return int(count)

    # -- management ----------------------------------------------------------------------------

    def delete(self, fid: int, key: str, now: dt.datetime) -> bool:
        """Mark job ``key`` of family ``fid`` deleted; False if there is none (or it was)."""
        with self.engine.begin() as conn:
            res = conn.execute(
                update(Job)
                .where(Job.family_id == fid, Job.key == key, Job.state != JobState.DELETED)
                .values(state=JobState.DELETED, due_at=None, lease_until=None, updated_at=now)
            )
        return bool(res.rowcount)

    def requeue_dead(
        self, fid: int, family: str, keys: Sequence[str] | None, now: dt.datetime
    ) -> int:
        """Queue dead jobs of family ``fid`` (all, or those ``keys``) due ``now``; how many."""
        stmt = update(Job).where(Job.family_id == fid, Job.state == JobState.DEAD)
        if keys is not None:
            stmt = stmt.where(Job.key.in_(keys))
        with self.engine.begin() as conn:
            count = conn.execute(
                stmt.values(state=JobState.QUEUED, due_at=now, failures=0, updated_at=now)
            ).rowcount
            if count:
                self._notify(conn, family)
        return int(count)

    # -- reads ---------------------------------------------------------------------------------

    def counts(self, now: dt.datetime, family: str | None) -> list[tuple[str, str, int, int]]:
        """(family, state, jobs, jobs due by ``now``) of the queue's states, per family."""
        stmt = (
            select(
                FamilyRow.name,
                Job.state,
                func.count(),
                func.sum(case((Job.due_at <= now, 1), else_=0)),
            )
            .join(FamilyRow, FamilyRow.id == Job.family_id)
            .where(Job.state.in_(QUEUE_STATES))
            .group_by(FamilyRow.name, Job.state)
        )
        if family is not None:
            stmt = stmt.where(FamilyRow.name == family)
        with self.engine.connect() as conn:
            rows = conn.execute(stmt).all()
        return [(name, state, int(n), int(due or 0)) for name, state, n, due in rows]

    def jobs(
        self, family: str | None, state: str | None, limit: int, key: str | None
    ) -> list[QueuedJob]:
        """Jobs of the queue (of ``state``, else any queue state), most urgent first."""
        stmt = _listing()
        stmt = stmt.where(Job.state == state if state else Job.state.in_(QUEUE_STATES))
        if family is not None:
            stmt = stmt.where(FamilyRow.name == family)
        if key is not None:
            stmt = stmt.where(Job.key == key)
        stmt = stmt.order_by(Job.state, Job.priority.desc(), Job.due_at, Job.id).limit(limit)
        with self.engine.connect() as conn:
            return [QueuedJob(*r) for r in conn.execute(stmt)]

    def get(self, fid: int, key: str) -> QueuedJob | None:
        """Job ``key`` of family ``fid`` in any state, or None."""
        stmt = _listing().where(Job.family_id == fid, Job.key == key)
        with self.engine.connect() as conn:
            row = conn.execute(stmt).first()
        return QueuedJob(*row) if row is not None else None

    def result(self, fid: int, key: str) -> str | None:
        """The result (JSON text) of the job's latest successful execution, or None."""
        with self.engine.connect() as conn:
            return conn.scalar(
                select(Execution.result)
                .join(Job, Job.id == Execution.job_id)
                .where(Job.family_id == fid, Job.key == key, Execution.state == ExecState.DONE)
                .order_by(Execution.id.desc())
                .limit(1)
            )

    def next_due(self, families: Sequence[str] | None) -> dt.datetime | None:
        """The earliest due time among queued jobs (of the families named), or None."""
        stmt = select(func.min(Job.due_at)).where(Job.state == JobState.QUEUED)
        if families is not None:
            stmt = stmt.where(_of_families(families))
        with self.engine.connect() as conn:
            value = conn.scalar(stmt)
        if isinstance(value, str):  # SQLite's min() of a DateTime column is plain text
            value = dt.datetime.fromisoformat(value)
        return value

    # -- execution ids for results recorded without a master -----------------------------------

    def next_exec_id(self) -> int:
        """A fresh execution id from the log's sequence (see :mod:`jodl.log.exec_ids`)."""
        with self._ids_lock:
            if self._ids is None:
                self._ids = ExecIds(self.engine)
            return self._ids.take(1)[0]


def _of_families(names: Sequence[str]) -> Any:
    """Jobs of the families named, looked up in the same statement: agents name families
    that have no row (nothing of theirs was ever added), and a lookup of its own made
    every claim read the family table again (a tenth of the claiming thread's time)."""
    return Job.family_id.in_(select(FamilyRow.id).where(FamilyRow.name.in_(names)))


def _listing() -> Any:
    return select(
        Job.id,
        FamilyRow.name,
        Job.key,
        Job.state,
        Job.due_at,
        Job.priority,
        Job.attempts,
        Job.failures,
        Job.lease_until,
        Job.last_error,
        Job.updated_at,
    ).join(FamilyRow, FamilyRow.id == Job.family_id)
