"""The reconstruction log: every database write of the library goes through here.

Writes are batched (one statement per loop step, not per job) and committed
before the master acts on them (sends) or before it acknowledges results to the
agents, so a master killed at any point restarts from these tables alone.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import secrets
import socket
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    DateTime,
    Engine,
    Integer,
    bindparam,
    case,
    create_engine,
    event,
    exists,
    func,
    insert,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from . import budget, bulk
from .exceptions import JodlError, LeaseHeld, StoreUnavailable
from .learning import LearningLog, learn_from_executions, settle_homes
from .models import (
    Cluster,
    Dispatch,
    ExecState,
    Execution,
    Family,
    FamilyOnNode,
    Job,
    JobState,
    MasterLease,
    Node,
    NodeState,
    Run,
    RunRequest,
    RunState,
    utcnow,
)

log = logging.getLogger("jodl.store")


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
    jobs: list[JobResult]

    def __iter__(self) -> Iterator[JobResult]:
        return iter(self.jobs)

    def __len__(self) -> int:
        return len(self.jobs)

#: Execution ids handed to a master per allocation (one UPDATE per block).
EXEC_ID_BLOCK = 20_000
#: Seconds a master's lease lasts without renewal. The running master renews it
#: every :data:`LEASE_RENEW` seconds (one small UPDATE); a master that stalls longer
#: (or dies) lets another one take over.
LEASE_SECONDS = 30.0
#: Seconds between two renewals by the running master: a third of the lease, so two
#: renewals may fail (a slow disk, a busy database) before it expires.
LEASE_RENEW = LEASE_SECONDS / 3


def holder_gone(holder: str) -> bool:
    """True when ``holder`` (``HOST:PID...``, a master's name) is a process on this host
    that no longer exists, so its lease need not be waited for."""
    host, _, rest = holder.partition(":")
    pid = rest.split(":", 1)[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def normalise_url(url: str) -> str:
    """Accept ``postgresql://`` and ``postgres://`` URLs by selecting psycopg 3."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for ``url``, checked to answer; :class:`StoreUnavailable` if it does not."""
    url = normalise_url(url)
    if url.startswith("sqlite"):
        _create_private(make_url(url).database)
        kwargs.setdefault("connect_args", {"check_same_thread": False, "timeout": 30})
        engine = create_engine(url, **kwargs)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

    else:
        kwargs.setdefault("pool_pre_ping", True)
        engine = create_engine(url, **kwargs)
    try:
        with engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")
    except OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise StoreUnavailable(
            f"cannot reach the database {engine.url.render_as_string(hide_password=True)}: {reason}"
        ) from None
    return engine


def _create_private(path: str | None) -> None:
    """Create a new SQLite file readable by its owner only (0600).

    It holds password hashes, addresses and page text. SQLite gives its -wal and
    -shm files the database file's mode. An existing file keeps its mode."""
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError:
        pass  # it exists, or no such directory (SQLite reports that on connecting)


def ensure_schema(engine: Engine) -> None:
    """Bring the database to the newest migration (``jodl db upgrade``)."""
    from .migrate import upgrade

    upgrade(engine)


#: First pause before an on-demand job that failed runs again (seconds); doubles per failure.
RETRY_DELAY = 1.0
#: Longest pause before an on-demand job that failed runs again (seconds).
RETRY_DELAY_MAX = 300.0


def retry_delay(failures: int) -> float:
    """Seconds an on-demand job waits in the queue after its ``failures``-th failure."""
    return min(RETRY_DELAY_MAX, RETRY_DELAY * 2 ** max(0, min(failures - 1, 30)))


def close_claims(
    conn: Connection,
    done: Sequence[tuple[int, int]] = (),
    failed: Sequence[tuple[int, int, str, dt.datetime | None]] = (),
) -> int:
    """Attempt-guarded ends of claimed on-demand jobs; returns how many rows changed.

    ``done``: (job_id, attempt). The job is done, or queued again when it was
    enqueued again while it ran (``due_at`` set meanwhile). ``failed``: (job_id,
    attempt, error, due_at): back in the queue at ``due_at`` (an enqueue made
    while it ran wins), or dead when ``due_at`` is None. Only a job still claimed
    by that very attempt changes, so a late outcome of a superseded attempt (its
    lease ended and another claim took the job) changes nothing.
    """
    now = utcnow()
    changed = 0
    guard = (
        Job.id == bindparam("jid"),
        Job.state == JobState.CLAIMED,
        Job.attempts == bindparam("att"),
    )
    if done:
        finish = {
            "state": case((Job.due_at.is_(None), JobState.DONE), else_=JobState.QUEUED),
            "failures": 0,
            "lease_until": None,
            "last_done_at": now,
            "updated_at": now,
        }
        if conn.dialect.name == "postgresql":
            # The batch as two arrays: one statement and one plan for thousands of jobs.
            claims = (
                func.unnest(
                    bindparam("jids", [j for j, _ in done], type_=ARRAY(BigInteger)),
                    bindparam("atts", [a for _, a in done], type_=ARRAY(Integer)),
                )
                .table_valued("jid", "att")
                .render_derived()
            )
            changed += conn.execute(
                update(Job)
                .where(
                    Job.id == claims.c.jid,
                    Job.state == JobState.CLAIMED,
                    Job.attempts == claims.c.att,
                )
                .values(**finish)
            ).rowcount
        else:
            changed += conn.execute(
                update(Job).where(*guard).values(**finish),
                [{"jid": j, "att": a} for j, a in done],
            ).rowcount
    if failed:
        changed += conn.execute(
            update(Job)
            .where(*guard)
            .values(
                state=bindparam("st"),
                due_at=func.coalesce(Job.due_at, bindparam("due", type_=DateTime())),
                failures=Job.failures + 1,
                lease_until=None,
                last_error=bindparam("err"),
                updated_at=now,
            ),
            [
                {
                    "jid": j,
                    "att": a,
                    "err": e,
                    "due": due,
                    "st": JobState.DEAD if due is None else JobState.QUEUED,
                }
                for j, a, e, due in failed
            ],
        ).rowcount
    return changed


@dataclass
class PendingJob:
    """A job of an open run (or a claimed on-demand job) with no committed result yet."""

    __slots__ = (
        "id",
        "key",
        "family",
        "payload",
        "priority",
        "run_id",
        "permanent_node_id",
        "trial_node_id",
        "attempts",
        "failed_on",
        "claim",
    )
    id: int
    key: str
    family: str
    payload: str
    priority: int
    run_id: int | None
    permanent_node_id: int | None
    trial_node_id: int | None
    attempts: int
    failed_on: set[int]
    #: For on-demand jobs: the attempt number that claimed it (guards completion).
    claim: int | None


#: Columns of an execution row, in the order :meth:`Store.record_outcomes` takes them.
EXEC_COLUMNS = (
    "id",
    "run_id",
    "job_id",
    "node_id",
    "attempt",
    "state",
    "backup",
    "epoch",
    "sent_at",
    "started_at",
    "finished_at",
    "duration",
    "result",
    "error",
)


@dataclass
class Sent:
    """An execution of an open dispatch with no outcome row: in flight, as far as the log knows."""

    exec_id: int
    job_id: int
    node_id: int
    attempt: int
    dispatch_id: int
    sent_at: dt.datetime
    run_id: int | None


class Store(LearningLog):
    """Reads and writes of the reconstruction log for one master."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)
        self._ids = iter(())
        self._ids_left = 0
        self.dialect = engine.dialect.name

    def session(self) -> Session:
        return self.sessions()

    # -- master lease, epochs and execution ids ---------------------------------------

    def acquire_lease(self, holder: str, name: str = "master", force: bool = False) -> int:
        """Take the master lease and return the new epoch (older masters are fenced).

        A lease another holder renewed less than :data:`LEASE_SECONDS` ago is live:
        :class:`LeaseHeld` unless ``force`` (an explicit takeover). A holder on this
        host whose process is gone (killed) counts as expired at once.
        """
        now = utcnow()
        with self.session() as s, s.begin():
            lease = s.get(MasterLease, name, with_for_update=True)
            if lease is None:
                lease = MasterLease(
                    name=name, holder=holder, epoch=0, expires_at=now, next_exec_id=1
                )
                s.add(lease)
            elif (
                not force
                and lease.holder != holder
                and lease.expires_at > now
                and not holder_gone(lease.holder)
            ):
                raise LeaseHeld(lease.holder, (lease.expires_at - now).total_seconds())
            lease.epoch += 1
            lease.holder = holder
            lease.expires_at = now + dt.timedelta(seconds=LEASE_SECONDS)
            s.flush()
            return lease.epoch

    def lease_holder(self, name: str = "master") -> str | None:
        """Who holds a live lease (renewed, its process not known to be gone); None: nobody."""
        with self.session() as s:
            lease = s.get(MasterLease, name)
            if lease is None or lease.expires_at <= utcnow() or holder_gone(lease.holder):
                return None
            return lease.holder

    def cluster_id(self) -> str:
        """This database's cluster id, drawn on first use (agents bind their memory to it)."""
        with self.session() as s:
            found = s.scalar(select(Cluster.id).order_by(Cluster.created_at).limit(1))
        if found is not None:
            return found
        try:
            with self.session() as s, s.begin():
                s.add(Cluster(id=secrets.token_hex(16), created_at=utcnow()))
        except IntegrityError:
            pass  # the same moment in another master: read theirs
        with self.session() as s:
            found = s.scalar(select(Cluster.id).order_by(Cluster.created_at, Cluster.id).limit(1))
        assert found is not None
        return found

    def settled(self, exec_ids: Sequence[int]) -> set[int]:
        """Which of ``exec_ids`` have an outcome in the log (done, or given up on)."""
        out: set[int] = set()
        with self.engine.connect() as conn:
            for start in range(0, len(exec_ids), 5000):
                chunk = list(exec_ids[start : start + 5000])
                out.update(conn.scalars(select(Execution.id).where(Execution.id.in_(chunk))))
        return out

    def renew_lease(self, holder: str, epoch: int, name: str = "master") -> bool:
        """Extend the lease; False when another master has taken it (we are fenced)."""
        with self.engine.begin() as conn:
            res = conn.execute(
                update(MasterLease)
                .where(MasterLease.name == name, MasterLease.epoch == epoch)
                .values(expires_at=utcnow() + dt.timedelta(seconds=LEASE_SECONDS))
            )
            return res.rowcount == 1

    def release_lease(self, epoch: int, name: str = "master") -> None:
        """End our lease now (a clean stop): the next master need not wait for it to expire."""
        with self.engine.begin() as conn:
            conn.execute(
                update(MasterLease)
                .where(MasterLease.name == name, MasterLease.epoch == epoch)
                .values(expires_at=utcnow())
            )

    def next_exec_ids(self, count: int, name: str = "master") -> list[int]:
        """``count`` fresh execution ids (allocated in committed blocks, never reused)."""
        out: list[int] = []
        while len(out) < count:
            if self._ids_left == 0:
                block = max(EXEC_ID_BLOCK, count - len(out))
                with self.engine.begin() as conn:
                    start = (
                        conn.execute(
                            update(MasterLease)
                            .where(MasterLease.name == name)
                            .values(next_exec_id=MasterLease.next_exec_id + block)
                            .returning(MasterLease.next_exec_id)
                        ).scalar_one()
                        - block
                    )
                self._ids = iter(range(start, start + block))
                self._ids_left = block
            take = min(self._ids_left, count - len(out))
            out.extend(next(self._ids) for _ in range(take))
            self._ids_left -= take
        return out

    # -- families and nodes -----------------------------------------------------------------

    def ensure_family(self, name: str, **fields: Any) -> Family:
        with self.session() as s, s.begin():
            fam = s.scalar(select(Family).where(Family.name == name))
            if fam is None:
                fam = Family(name=name, **fields)
                s.add(fam)
                s.flush()
            return fam

    def family(self, name: str) -> Family | None:
        with self.session() as s:
            return s.scalar(select(Family).where(Family.name == name))

    def nodes(self, include_removed: bool = False) -> list[Node]:
        with self.session() as s:
            q = select(Node).order_by(Node.id)
            if not include_removed:
                q = q.where(Node.state != NodeState.REMOVED)
            return list(s.scalars(q))

    def add_node(self, address: str, slots: int = 1, labels: dict[str, Any] | None = None) -> Node:
        """Register (or re-activate) a node; a node coming back keeps its id and learning."""
        with self.session() as s, s.begin():
            node = s.scalar(select(Node).where(Node.address == address))
            if node is None:
                node = Node(address=address, slots=slots, labels=labels or {})
                s.add(node)
            else:
                node.state = NodeState.ACTIVE
                node.retry_at = None
                node.failures = 0
                if labels:
                    node.labels = labels
            s.flush()
            return node

    def remove_node(self, address: str) -> bool:
        with self.engine.begin() as conn:
            res = conn.execute(
                update(Node).where(Node.address == address).values(state=NodeState.REMOVED)
            )
            return res.rowcount > 0

    def update_node(self, node_id: int, **values: Any) -> None:
        with self.engine.begin() as conn:
            conn.execute(update(Node).where(Node.id == node_id).values(**values))

    def family_rules(self, family_id: int) -> dict[int, FamilyOnNode]:
        with self.session() as s:
            rows = s.scalars(select(FamilyOnNode).where(FamilyOnNode.family_id == family_id))
            return {r.node_id: r for r in rows}

    # -- runs ----------------------------------------------------------------------------------

    def open_run(self, family: Family, epoch: int) -> tuple[Run, bool]:
        """The family's unfinished run (resumed: True) or a new one with its due jobs.

        A run's jobs are not written one by one: the run records what fixes its
        membership (number, opening time, the newest job id then), and
        :meth:`run_jobs` selects the members again with the same rule on resume.
        """
        with self.session() as s, s.begin():
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
            recent = self._too_recent(s, run)
            members = self._member_filter(run)
            run.jobs_total = (s.scalar(select(func.count()).where(*members)) or 0) - len(recent)
            budget.cut_run(s, run, family, members, recent)  # at most N jobs per cycle
            return run, False

    @staticmethod
    def _member_filter(run: Run) -> tuple[Any, ...]:
        """Jobs due in ``run``: idle, older than the run, and due by their every-N-cycles."""
        return (
            Job.family_id == run.family_id,
            Job.state == JobState.IDLE,
            Job.id <= (run.max_job_id or 0),
            or_(
                Job.last_run_number.is_(None),
                run.number - Job.last_run_number >= Job.every_n_cycles,
            ),
            *budget.member_cut(run),
        )

    @staticmethod
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

    def run_jobs(self, run: Run, family_name: str) -> list[PendingJob]:
        """Jobs of ``run`` with no committed result, with their attempts so far in it."""
        done = exists().where(
            Execution.run_id == run.id,
            Execution.job_id == Job.id,
            Execution.state == ExecState.DONE,
        )
        with self.engine.connect() as conn:
            failed_on: dict[int, list[int]] = {}
            for job_id, node_id in conn.execute(
                select(Execution.job_id, Execution.node_id).where(
                    Execution.run_id == run.id, Execution.state == ExecState.FAILED
                )
            ):
                failed_on.setdefault(job_id, []).append(node_id)
            skip = self._too_recent(conn, run)
            rows = conn.execute(
                select(
                    Job.id,
                    Job.key,
                    Job.payload,
                    Job.priority,
                    Job.permanent_node_id,
                    Job.trial_node_id,
                )
                .where(*self._member_filter(run), ~done)
                .order_by(*budget.oldest_due())  # those a budget put off last time first
            ).all()  # one fetch: iterating the result fetches row by row
            return [
                PendingJob(
                    job_id,
                    key,
                    family_name,
                    payload,
                    priority,
                    run.id,
                    home,
                    trial,
                    len(failed_on.get(job_id, ())),
                    set(failed_on.get(job_id, ())),
                    None,
                )
                for job_id, key, payload, priority, home, trial in rows
                if job_id not in skip
            ]

    def sent_executions(self, run_ids: Sequence[int | None]) -> list[Sent]:
        """Executions of open dispatches of these runs (None: on-demand) with no outcome."""
        ids = [r for r in run_ids if r is not None]
        cond = Dispatch.run_id.in_(ids)
        if None in run_ids:
            cond = or_(cond, Dispatch.run_id.is_(None))
        with self.engine.connect() as conn:
            sent = [
                Sent(exec_id, job_id, node_id, attempt, did, sent_at, run_id)
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
            return int(
                conn.scalar(select(func.count()).where(Run.state == RunState.RUNNING)) or 0
            )

    def run_progress(self, run_id: int, done: int, failed: int, dead: int) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(Run)
                .where(Run.id == run_id)
                .values(jobs_done=done, jobs_failed=failed, jobs_dead=dead)
            )

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

    def finish_run(self, run: Run, makespan: float | None, lower_bound: float | None) -> Run:
        """Close the run: counts, makespan, jobs' last run (learning came with each outcome)."""
        now = utcnow()
        with self.session() as s, s.begin():
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
            counts = dict(
                s.execute(
                    select(Execution.state, func.count())
                    .where(
                        Execution.run_id == run.id,
                        Execution.state.in_((ExecState.DONE, ExecState.FAILED)),
                    )
                    .group_by(Execution.state)
                ).all()
            )
            db_run = s.get(Run, run.id)
            assert db_run is not None
            budget.after_run(s, db_run)
            db_run.jobs_done = counts.get(ExecState.DONE, 0)
            db_run.jobs_failed = counts.get(ExecState.FAILED, 0)
            db_run.jobs_dead = (
                s.scalar(
                    select(func.count()).where(Job.run_id == run.id, Job.state == JobState.DEAD)
                )
                or 0
            )
            db_run.state = RunState.FINISHED
            db_run.finished_at = now
            db_run.makespan = makespan
            db_run.lower_bound = lower_bound
            if makespan and lower_bound:
                db_run.ratio = makespan / lower_bound
            s.flush()
            return db_run

    # -- executions (the hot path: one statement per step) ---------------------------------

    def record_dispatches(self, rows: list[dict[str, Any]]) -> None:
        """Log batches about to be sent (write-ahead): id, run_id, node_id, epoch, items."""
        if not rows:
            return
        now = utcnow()
        for row in rows:
            row.setdefault("sent_at", now)
            row.setdefault("is_open", True)
        with self.engine.begin() as conn:
            bulk.insert_rows(conn, Dispatch.__table__, rows)

    def record_outcomes(
        self,
        executions: Sequence[tuple[Any, ...]],
        dead: Sequence[tuple[int, str, int | None]] = (),
        claims_done: Sequence[tuple[Any, ...]] = (),
        closed: Sequence[int] = (),
        claims_failed: Sequence[tuple[int, int, str, dt.datetime | None]] = (),
        homes: Sequence[tuple[int, int | None, int | None]] = (),
        settle: bool = False,
    ) -> None:
        """Commit outcomes, and what they teach, in one transaction.

        ``executions``: rows in :data:`EXEC_COLUMNS` order (done, failed, lost, ...).
        ``dead``: (job_id, error, run_id) of jobs that used up their attempts.
        ``claims_done``: outcomes of claimed on-demand jobs: (job_id, attempt) of
        those now complete, (job_id, attempt, error, due_at) of those that failed
        (see :func:`close_claims`); the attempt guards them, so a superseded
        attempt changes nothing.
        ``closed``: dispatches whose executions all have an outcome now.
        ``claims_failed``: more failed claims, (job_id, attempt, error, due_at):
        back in the queue at ``due_at``, or dead when it is None.
        ``homes``: (job_id, permanent node, trial node) of jobs whose home changed;
        ``settle``: jobs with no home get the node of their result (:func:`settle_homes`).
        Done and failed executions are folded into JobOnNode (:func:`learn_from_executions`).
        An execution id has one outcome row at most (primary key), and a job one
        ``done`` row per run (unique index): the database refuses a second.
        """
        if not (executions or dead or claims_done or closed or claims_failed or homes):
            return
        with self.engine.begin() as conn:
            if executions:
                # One COPY into a staging table feeds the log, the learning and the homes.
                with bulk.staged(conn, Execution.__table__, EXEC_COLUMNS, executions) as batch:
                    conn.execute(
                        bulk.prepared(
                            conn,
                            f"append:{batch.name}",
                            lambda: insert(Execution).from_select(
                                EXEC_COLUMNS, select(*(batch.c[c] for c in EXEC_COLUMNS))
                            ),
                        )
                    )
                    learn_from_executions(conn, batch, utcnow())
                    if settle:
                        settle_homes(conn, batch)
            if homes:
                self.write_homes(conn, homes)
            if dead:
                conn.execute(
                    update(Job)
                    .where(Job.id == bindparam("jid"))
                    .values(
                        state=JobState.DEAD,
                        last_error=bindparam("err"),
                        run_id=bindparam("rid"),
                        updated_at=utcnow(),
                    ),
                    [{"jid": j, "err": e, "rid": r} for j, e, r in dead],
                )
            if claims_done or claims_failed:
                done = [c for c in claims_done if len(c) == 2]
                failed = [c for c in claims_done if len(c) == 4]
                close_claims(conn, done, [*failed, *claims_failed])
            if closed:
                conn.execute(
                    update(Dispatch).where(Dispatch.id.in_(list(closed))).values(is_open=False)
                )

    # -- jobs ---------------------------------------------------------------------------------

    def add_jobs(
        self,
        family: Family | str,
        jobs: Iterable[tuple[str, Any]] | Mapping[str, Any],
        priority: int | None = None,
    ) -> int:
        """Add jobs to a family (created if it is new, given by name); the number added.

        ``jobs`` maps each job's key to its payload, as a mapping or (key, payload)
        pairs; a payload is a dict (encoded to JSON here) or JSON text. One
        transaction: all are added or none; keys the family already has are kept.
        New jobs take the family's job defaults (``jodl family set``) where set.
        """
        if isinstance(family, str):
            family = self.ensure_family(family)
        defaults = (family.settings or {}).get("job_defaults") or {}
        pairs = jobs.items() if isinstance(jobs, Mapping) else jobs
        jobs = ((k, p if isinstance(p, str) else json.dumps(p)) for k, p in pairs)
        rows = [
            {
                "family_id": family.id,
                "key": k,
                "payload": p,
                "priority": defaults.get("priority", 0) if priority is None else priority,
                "every_n_cycles": defaults.get("every_n_cycles", 1),
                "min_interval": defaults.get("min_interval"),
                "state": JobState.IDLE,
            }
            for k, p in jobs
        ]
        if not rows:
            return 0
        with self.engine.begin() as conn:
            have = set()
            keys = [r["key"] for r in rows]
            for start in range(0, len(keys), 5000):
                have.update(
                    conn.scalars(
                        select(Job.key).where(
                            Job.family_id == family.id, Job.key.in_(keys[start : start + 5000])
                        )
                    )
                )
            new = [r for r in rows if r["key"] not in have]
            for start in range(0, len(new), 10000):
                conn.execute(insert(Job), new[start : start + 10000])
            return len(new)

    def results(self, family: str, run: int | None = None) -> RunResults:
        """What run number ``run`` of ``family`` (default: its newest) gave, per job.

        A job with a committed result is ``done`` with it; otherwise its newest
        attempt's state (``failed``, ``lost``, ...) and error; ``dead`` when the run
        gave up on it. Jobs without any attempt yet are not listed.
        """
        with self.session() as s:
            query = select(Run).join(Family, Family.id == Run.family_id).where(
                Family.name == family
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

    # -- cycles asked of the running master (jodl/run_requests.py) --------------------------

    def request_run(self, family: str) -> int:
        """Record that a cycle of ``family`` is asked of the running master; the request's id."""
        with self.session() as s, s.begin():
            row = RunRequest(family=family, requested_at=utcnow())
            s.add(row)
            s.flush()
            return row.id

    def take_run_requests(self, taker: str) -> list[tuple[int, str]]:
        """Take every untaken request for ``taker``: (request id, family) pairs, oldest first.

        A conditional UPDATE: of two masters taking at once, one gets each request.
        """
        with self.engine.begin() as conn:
            rows = conn.execute(
                select(RunRequest.id, RunRequest.family)
                .where(RunRequest.taken_at.is_(None))
                .order_by(RunRequest.id)
            ).all()
            if not rows:
                return []
            taken = set(
                conn.scalars(
                    update(RunRequest)
                    .where(RunRequest.id.in_([r[0] for r in rows]), RunRequest.taken_at.is_(None))
                    .values(taken_at=utcnow(), taken_by=taker[:255])
                    .returning(RunRequest.id)
                )
            )
        return [(rid, family) for rid, family in rows if rid in taken]

    def settle_run_request(self, request_id: int, **outcome: Any) -> None:
        """Record a request's outcome: ``run_id``, ``summary`` and ``dead``, or ``error``."""
        with self.engine.begin() as conn:
            conn.execute(
                update(RunRequest)
                .where(RunRequest.id == request_id)
                .values(finished_at=utcnow(), **outcome)
            )

    def run_request(self, request_id: int) -> RunRequest | None:
        with self.session() as s:
            return s.get(RunRequest, request_id)

    def running_run(self, family: str) -> Run | None:
        """The family's unfinished run, if any."""
        with self.session() as s:
            return s.scalar(
                select(Run)
                .join(Family, Family.id == Run.family_id)
                .where(Family.name == family, Run.state == RunState.RUNNING)
                .order_by(Run.number.desc())
                .limit(1)
            )

    def deleted_jobs(self, job_ids: Iterable[int]) -> set[int]:
        """Which of these jobs were deleted meanwhile (checked once per loop step)."""
        ids = list(job_ids)
        out: set[int] = set()
        with self.engine.connect() as conn:
            for start in range(0, len(ids), 5000):
                out.update(
                    conn.scalars(
                        select(Job.id).where(
                            Job.id.in_(ids[start : start + 5000]), Job.state == JobState.DELETED
                        )
                    )
                )
        return out
