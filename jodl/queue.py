"""The on-demand queue: delayed, unique, prioritised, at-least-once, on disk.

Any family's jobs can be enqueued at any time with a due time and a priority.
The queue lives in the job table itself (``jodl_job``), so it is as durable as
the reconstruction log and as large as the disk:

* **unique**: (family, key) is one row. Enqueueing an existing key moves its
  due time, takes the new payload and keeps the higher priority; a done, dead
  or deleted key is queued afresh. A key enqueued again *while it runs* runs
  once more after that run succeeds (no update is lost).
* **delayed and prioritised**: among due jobs the highest priority is claimed
  first, then the earliest due.
* **at least once**: a claim carries a lease. The holder renews it while the
  job runs; when the holder dies the lease ends and the job is queued again
  (counted as a failure). A job may therefore run twice, never zero times.
* **attempt-guarded**: every claim numbers its attempt (``Job.attempts`` never
  goes back). Completion and failure name the attempt, and only a job still
  claimed by that attempt changes; a late result of a superseded attempt
  changes nothing.
* **dead letters**: a job that failed ``max_attempts`` times in all (errors and
  ended leases) is dead: kept, counted, listed and re-queueable.

Claims use ``FOR UPDATE SKIP LOCKED`` on PostgreSQL, so masters and other
consumers never wait on each other's rows, and enqueues ``NOTIFY`` a channel
that :meth:`Queue.wait` and :class:`QueueFeeder` ``LISTEN`` on. On SQLite one
``UPDATE ... RETURNING`` statement claims atomically and waiting is short polling.

A failed attempt of a job run by the master goes back to the queue, due after
:func:`jodl.store.retry_delay` (exponential backoff), rather than being retried
at once inside the master: the failure count is then on disk, survives a
restart of the master, and the job may go to whichever master claims it next.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    DateTime,
    Engine,
    Integer,
    String,
    Text,
    and_,
    bindparam,
    case,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError, NoResultFound

from . import bulk
from .budget import HourlyBudgets
from .config import DEFAULT_MAX_ATTEMPTS, read_values
from .exceptions import BadPayload, JodlError
from .models import ExecState, Execution, Family, Job, JobState, MasterLease, utcnow
from .options import Option, register_options
from .protocol import loads_object
from .store import EXEC_COLUMNS, Store, close_claims, make_engine, retry_delay

log = logging.getLogger("jodl.queue")

#: Seconds a claim lasts unless its holder renews it.
DEFAULT_LEASE = 60.0
#: Seconds between two polls of a SQLite queue for due jobs.
DEFAULT_POLL = 0.05
#: Longest a PostgreSQL consumer goes without looking, even with no notification.
WAKE_MAX = 1.0
#: Seconds between two checks of a feeder's claims (deleted or lost jobs, ended leases).
CHECK_INTERVAL = 1.0
#: Jobs claimed by one statement at most.
CLAIM_BATCH = 2000
#: Rows per statement when a batch is split (bind-parameter limits).
CHUNK = 1000
#: The PostgreSQL channel enqueues notify (payload: the family name).
CHANNEL = "jodl_queue"

OPTIONS = (
    Option(
        "JODL_QUEUE_LEASE",
        str(DEFAULT_LEASE),
        "float+",
        "Seconds an on-demand job's claim lasts without renewal; after a master dies "
        "its claimed jobs come back after this long",
        "master",
    ),
    Option(
        "JODL_QUEUE_POLL",
        str(DEFAULT_POLL),
        "float+",
        "Seconds between polls of the on-demand queue on SQLite "
        "(PostgreSQL is woken by LISTEN/NOTIFY)",
        "master, web",
    ),
)
register_options(OPTIONS)

#: States a job of the on-demand queue can be in (the others belong to cycles).
QUEUE_STATES = (JobState.QUEUED, JobState.CLAIMED, JobState.DONE, JobState.DEAD)
_NOTHING: Any = object()

Payload = Mapping[str, Any] | str | None


@dataclass(frozen=True, slots=True)
class Claimed:
    """A job taken from the queue: run it, then complete or fail it with ``attempt``."""

    id: int
    family: str
    key: str
    payload: str
    priority: int
    #: The claim's attempt number: completion and failure must name it.
    attempt: int
    #: Failures since the job was last enqueued fresh.
    failures: int
    lease_until: dt.datetime
    permanent_node_id: int | None = None
    trial_node_id: int | None = None


@dataclass(frozen=True, slots=True)
class QueuedJob:
    """One job of the queue as listed by :meth:`Queue.jobs`."""

    id: int
    family: str
    key: str
    state: str
    due_at: dt.datetime | None
    priority: int
    attempts: int
    failures: int
    lease_until: dt.datetime | None
    last_error: str | None
    updated_at: dt.datetime


def payload_text(payload: Payload) -> str:
    """A payload as the JSON object text stored and sent to agents."""
    if payload is None:
        return "{}"
    if isinstance(payload, str):
        loads_object(payload)
        return payload
    if not isinstance(payload, Mapping):
        raise BadPayload(f"payload must be a JSON object, got {type(payload).__name__}")
    try:
        return json.dumps(payload, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise BadPayload(f"payload is not JSON: {exc}") from None


def _naive_utc(when: dt.datetime) -> dt.datetime:
    if when.tzinfo is None:
        return when
    return when.astimezone(dt.UTC).replace(tzinfo=None)


class Queue:
    """The on-demand queue over a store (or an engine, or a database URL).

    ``clock`` gives the current UTC time (naive); every due time, lease and
    count is computed from it, so tests can move time without sleeping.
    ``max_attempts`` applies to families that set none.
    """

    def __init__(
        self,
        store: Store | Engine | str,
        clock: Callable[[], dt.datetime] = utcnow,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        poll: float | None = None,
    ) -> None:
        if isinstance(store, str):
            store = make_engine(store)
        self.store = store if isinstance(store, Store) else Store(store)
        self.engine = self.store.engine
        self.clock = clock
        self.max_attempts = max_attempts
        self.poll = poll if poll is not None else read_values(OPTIONS)["queue_poll"]
        self.postgres = self.engine.dialect.name == "postgresql"
        self._family_ids: dict[str, int] = {}
        self._family_names: dict[int, str] = {}
        self._lock = threading.Lock()
        self._listener: _Listener | None = None
        self._ids: Store | None = None
        #: Per-hour budgets of families' on-demand jobs (jodl/budget.py).
        self.hourly = HourlyBudgets(self.engine)

    # -- families --------------------------------------------------------------------------

    def _load_families(self) -> None:
        with self.engine.connect() as conn:
            for fid, name in conn.execute(select(Family.id, Family.name)):
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
                    conn.execute(insert(Family).values(name=name))
            except IntegrityError:
                pass  # created meanwhile by another process
            self._load_families()
        return self._family_ids.get(name)

    def _family_name(self, fid: int) -> str:
        if fid not in self._family_names:
            self._load_families()
        return self._family_names[fid]

    # -- enqueue -----------------------------------------------------------------------------

    def _due(
        self, due_at: dt.datetime | None, delay: float | None, now: dt.datetime
    ) -> dt.datetime:
        if due_at is not None:
            return _naive_utc(due_at)
        return now + dt.timedelta(seconds=delay or 0.0)

    def enqueue(
        self,
        family: str,
        key: str,
        payload: Payload = None,
        due_at: dt.datetime | None = None,
        delay: float | None = None,
        priority: int = 0,
    ) -> int:
        """Queue job ``key`` of ``family``, due at ``due_at`` (or in ``delay`` s, or now).

        An existing key is updated in place (see the module's description); the
        job's id is returned either way.
        """
        return self.enqueue_many(family, [(key, payload)], due_at, delay, priority)[0]

    def enqueue_many(
        self,
        family: str,
        items: Iterable[tuple[str, Payload] | str],
        due_at: dt.datetime | None = None,
        delay: float | None = None,
        priority: int = 0,
    ) -> list[int]:
        """Queue many jobs of ``family`` in one transaction; their ids, by distinct key.

        ``items`` are (key, payload) pairs or bare keys (payload ``{}``). A key
        given twice counts once, with its last payload.
        """
        now = self.clock()
        due = self._due(due_at, delay, now)
        payloads: dict[str, str] = {}
        for item in items:
            key, payload = (item, None) if isinstance(item, str) else item
            if not isinstance(key, str) or not key:
                raise JodlError("a job key must be a non-empty string")
            payloads[key] = payload_text(payload)
        if not payloads:
            return []
        fid = self.family_id(family, create=True)
        assert fid is not None
        ids: dict[str, int] = {}
        with self.engine.begin() as conn:
            if self.postgres:
                # The batch travels as two arrays: one statement, one plan, any size.
                result = conn.execute(
                    _UPSERT_UNNEST,
                    {
                        "fid": fid,
                        "prio": int(priority),
                        "due": due,
                        "now": now,
                        "keys": list(payloads),
                        "payloads": list(payloads.values()),
                    },
                )
            else:
                rows = [
                    {
                        "family_id": fid,
                        "key": key,
                        "payload": text_,
                        "priority": int(priority),
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
                result = conn.execute(_UPSERT_SQLITE, rows)
            for job_id, key in result:
                ids[key] = job_id
            self._notify(conn, family)
        return [ids[k] for k in payloads]

    def _notify(self, conn: Any, family: str) -> None:
        if self.postgres:
            # Delivered at commit, so a woken consumer sees the rows.
            conn.execute(
                text("SELECT pg_notify(:channel, :family)"), {"channel": CHANNEL, "family": family}
            )

    # -- claim --------------------------------------------------------------------------------

    def claim(
        self, limit: int = 1, lease: float = DEFAULT_LEASE, families: Iterable[str] | None = None
    ) -> list[Claimed]:
        """Take up to ``limit`` due jobs (highest priority, then earliest due) for ``lease`` s.

        A family with an on-demand budget (:mod:`jodl.budget`) gives at most its
        budget's jobs per clock hour; its other jobs stay queued.
        """
        if limit <= 0:
            return []
        now = self.clock()
        until = now + dt.timedelta(seconds=lease)
        # The state as a literal, not a parameter: a prepared (generic) plan can then
        # still use the partial index of queued jobs (ix_jodl_job_queue).
        queued = Job.state == literal_column(f"'{JobState.QUEUED}'")
        due = select(Job.id).where(queued, Job.due_at <= now)
        if families is not None:
            fids = [f for f in (self.family_id(n) for n in families) if f is not None]
            if not fids:
                return []
            due = due.where(Job.family_id.in_(fids))
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
            if per_hour:
                rows = self.hourly.claim(
                    conn, per_hour, now, limit, lambda x, n: conn.execute(statement(x, n)).all()
                )
            else:
                rows = conn.execute(statement((), limit)).all()
        out = [
            Claimed(r[0], self._family_name(r[1]), r[2], r[3], r[4], r[5], r[6], until, r[7], r[8])
            for r in rows
        ]
        out.sort(key=lambda c: (-c.priority, c.id))
        return out

    def extend(self, claims: Iterable[tuple[int, int]], lease: float = DEFAULT_LEASE) -> set[int]:
        """Renew the leases of (job_id, attempt) claims; the ids still claimed by them."""
        pairs = list(claims)
        held: set[int] = set()
        if not pairs:
            return held
        until = self.clock() + dt.timedelta(seconds=lease)
        with self.engine.begin() as conn:
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

    def still_claimed(self, claims: Iterable[tuple[int, int]]) -> set[int]:
        """Which (job_id, attempt) claims still hold their job (read only)."""
        pairs = list(claims)
        held: set[int] = set()
        with self.engine.connect() as conn:
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

    def complete(self, job_id: int, attempt: int, result: Any = _NOTHING) -> bool:
        """Mark the job done if ``attempt`` still holds it; False (and no change) otherwise.

        A JSON ``result``, when given, is kept as the attempt's execution row
        (what :meth:`result` returns), in the same transaction.
        """
        # The id first: its allocation commits on its own (SQLite has one writer).
        exec_id = self._exec_id() if result is not _NOTHING else None
        with self.engine.begin() as conn:
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
                row += (False, 0, now, now, now, 0.0, json.dumps(result), None)
                table: Any = Execution.__table__
                bulk.copy_rows(conn, table, EXEC_COLUMNS, [row])
        return True

    ack = complete

    def complete_many(self, claims: Sequence[tuple[int, int]]) -> int:
        """Mark many (job_id, attempt) claims done in one transaction; how many were held."""
        if not claims:
            return 0
        with self.engine.begin() as conn:
            return close_claims(conn, done=list(claims))

    def fail(self, job_id: int, attempt: int, error: str, retryable: bool = True) -> str | None:
        """Record a failure of ``attempt``: the job's new state (queued or dead), or None.

        None means the attempt no longer held the job: nothing changed. A
        retryable failure queues the job again after a backoff, until its
        family's ``max_attempts`` failures in all make it dead.
        """
        with self.engine.begin() as conn:
            row = conn.execute(
                select(Job.failures, Family.max_attempts)
                .join(Family, Family.id == Job.family_id)
                .where(Job.id == job_id, Job.state == JobState.CLAIMED, Job.attempts == attempt)
            ).first()
            if row is None:
                return None
            failures = row[0] + 1
            dead = not retryable or failures >= (row[1] or self.max_attempts)
            due = None if dead else self.clock() + dt.timedelta(seconds=retry_delay(failures))
            if not close_claims(conn, failed=[(job_id, attempt, str(error), due)]):
                return None
        return JobState.DEAD if dead else JobState.QUEUED

    def release(self, claims: Iterable[tuple[int, int]]) -> int:
        """Give back (job_id, attempt) claims that never ran: queued again, no failure counted."""
        pairs = list(claims)
        if not pairs:
            return 0
        now = self.clock()
        count = 0
        with self.engine.begin() as conn:
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

    def release_expired(self) -> int:
        """Queue again (or kill) claimed jobs whose lease ended; how many there were.

        An ended lease counts as a failure of that attempt: the holder died or
        lost touch, and the job may have run partly.
        """
        now = self.clock()
        limit = func.coalesce(
            select(Family.max_attempts).where(Family.id == Job.family_id).scalar_subquery(),
            self.max_attempts,
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
        if count:
            log.info("%d on-demand jobs came back after their lease ended", count)
        return int(count)

    # -- management ----------------------------------------------------------------------------

    def delete(self, family: str, key: str) -> bool:
        """Delete a job: never dispatched again (a running attempt is cancelled by its master)."""
        fid = self.family_id(family)
        if fid is None:
            return False
        with self.engine.begin() as conn:
            res = conn.execute(
                update(Job)
                .where(Job.family_id == fid, Job.key == key, Job.state != JobState.DELETED)
                .values(
                    state=JobState.DELETED, due_at=None, lease_until=None, updated_at=self.clock()
                )
            )
        return bool(res.rowcount)

    def requeue_dead(self, family: str, keys: Iterable[str] | None = None) -> int:
        """Queue dead jobs of ``family`` again (all, or those ``keys``), due now, fresh budget."""
        fid = self.family_id(family)
        if fid is None:
            return 0
        now = self.clock()
        stmt = update(Job).where(Job.family_id == fid, Job.state == JobState.DEAD)
        if keys is not None:
            stmt = stmt.where(Job.key.in_(list(keys)))
        with self.engine.begin() as conn:
            count = conn.execute(
                stmt.values(state=JobState.QUEUED, due_at=now, failures=0, updated_at=now)
            ).rowcount
            if count:
                self._notify(conn, family)
        return int(count)

    def counts(self, family: str | None = None) -> dict[str, dict[str, int]]:
        """Per family: queued (waiting, due or not), running (claimed), overdue (due
        now and not taken yet), dead and done jobs."""
        now = self.clock()
        stmt = (
            select(
                Family.name,
                Job.state,
                func.count(),
                func.sum(case((Job.due_at <= now, 1), else_=0)),
            )
            .join(Family, Family.id == Job.family_id)
            .where(Job.state.in_(QUEUE_STATES))
            .group_by(Family.name, Job.state)
        )
        if family is not None:
            stmt = stmt.where(Family.name == family)
        out: dict[str, dict[str, int]] = {}
        with self.engine.connect() as conn:
            for name, state, count, due in conn.execute(stmt):
                entry = out.setdefault(
                    name, {"queued": 0, "running": 0, "overdue": 0, "dead": 0, "done": 0}
                )
                if state == JobState.QUEUED:
                    entry["queued"] = int(count)
                    entry["overdue"] = int(due or 0)
                elif state == JobState.CLAIMED:
                    entry["running"] = int(count)
                else:
                    entry[state] = int(count)
        if family is not None and family not in out and self.family_id(family) is not None:
            out[family] = {"queued": 0, "running": 0, "overdue": 0, "dead": 0, "done": 0}
        return out

    def jobs(
        self,
        family: str | None = None,
        state: str | None = None,
        limit: int = 100,
        key: str | None = None,
    ) -> list[QueuedJob]:
        """Jobs of the queue (not cycle jobs), most urgent first."""
        stmt = _listing()
        stmt = stmt.where(Job.state == state if state else Job.state.in_(QUEUE_STATES))
        if family is not None:
            stmt = stmt.where(Family.name == family)
        if key is not None:
            stmt = stmt.where(Job.key == key)
        stmt = stmt.order_by(Job.state, Job.priority.desc(), Job.due_at, Job.id).limit(limit)
        with self.engine.connect() as conn:
            return [QueuedJob(*r) for r in conn.execute(stmt)]

    def get(self, family: str, key: str) -> QueuedJob | None:
        """The job ``key`` of ``family`` in any state (deleted and cycle jobs too), or None."""
        fid = self.family_id(family)
        if fid is None:
            return None
        stmt = _listing().where(Job.family_id == fid, Job.key == key)
        with self.engine.connect() as conn:
            row = conn.execute(stmt).first()
        return QueuedJob(*row) if row is not None else None

    def result(self, family: str, key: str) -> Any:
        """The result of the job's latest successful attempt (decoded JSON), or None."""
        fid = self.family_id(family)
        if fid is None:
            return None
        with self.engine.connect() as conn:
            text_ = conn.scalar(
                select(Execution.result)
                .join(Job, Job.id == Execution.job_id)
                .where(Job.family_id == fid, Job.key == key, Execution.state == ExecState.DONE)
                .order_by(Execution.id.desc())
                .limit(1)
            )
        return json.loads(text_) if text_ else None

    def next_due(self, families: Iterable[str] | None = None) -> dt.datetime | None:
        """The earliest due time among queued jobs (of ``families``), or None."""
        stmt = select(func.min(Job.due_at)).where(Job.state == JobState.QUEUED)
        if families is not None:
            fids = [f for f in (self.family_id(n) for n in families) if f is not None]
            if not fids:
                return None
            stmt = stmt.where(Job.family_id.in_(fids))
        with self.engine.connect() as conn:
            value = conn.scalar(stmt)
        if isinstance(value, str):  # SQLite's min() of a DateTime column is plain text
            value = dt.datetime.fromisoformat(value)
        return value

    # -- waiting ---------------------------------------------------------------------------------

    def wait(self, timeout: float, families: Iterable[str] | None = None) -> bool:
        """Block until a job may be due or ``timeout`` s passed; True unless timed out.

        PostgreSQL: woken by the NOTIFY of an enqueue (on a dedicated LISTEN
        connection) or when the earliest future due time comes. SQLite: short
        polling every ``poll`` seconds.
        """
        deadline = time.monotonic() + timeout
        fams = None if families is None else list(families)
        if self.postgres:
            listener = self._listen()  # listen first, then look: no wake-up is lost
            while True:
                nxt = self.next_due(fams)
                left = deadline - time.monotonic()
                if nxt is not None:
                    until_due = (nxt - self.clock()).total_seconds()
                    if until_due <= 0:
                        return True
                    left = min(left, until_due)
                if left <= 0:
                    return False
                if listener is None:
                    time.sleep(min(left, WAKE_MAX))
                elif listener.wait(min(left, WAKE_MAX)):
                    return True
        while True:
            nxt = self.next_due(fams)
            if nxt is not None and nxt <= self.clock():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(self.poll, left))

    def notified(self) -> bool:
        """PostgreSQL: True when an enqueue was notified since the last call (no waiting)."""
        listener = self._listen() if self.postgres else None
        return listener.wait(0.0) if listener is not None else False

    def _listen(self) -> _Listener | None:
        with self._lock:
            if self._listener is None or self._listener.broken:
                try:
                    self._listener = _Listener(self.engine)
                except Exception as exc:  # noqa: BLE001 - fall back to polling
                    log.warning("cannot LISTEN for the queue (polling instead): %s", exc)
                    self._listener = None
            return self._listener

    def close(self) -> None:
        """Close the LISTEN connection (if any)."""
        with self._lock:
            if self._listener is not None:
                self._listener.close()
                self._listener = None

    # -- execution ids for results recorded without a master -------------------------------------

    def _exec_id(self) -> int:
        with self._lock:
            if self._ids is None:
                self._ids = Store(self.engine)
            for _ in range(2):
                try:
                    return self._ids.next_exec_ids(1)[0]
                except NoResultFound:
                    # No master ever ran here: create the id counter it will use.
                    try:
                        with self.engine.begin() as conn:
                            conn.execute(
                                insert(MasterLease).values(
                                    name="master", holder="", epoch=0, expires_at=utcnow()
                                )
                            )
                    except IntegrityError:
                        pass
            raise JodlError("cannot allocate an execution id")


def _listing() -> Any:
    return select(
        Job.id,
        Family.name,
        Job.key,
        Job.state,
        Job.due_at,
        Job.priority,
        Job.attempts,
        Job.failures,
        Job.lease_until,
        Job.last_error,
        Job.updated_at,
    ).join(Family, Family.id == Job.family_id)


def _on_conflict(ins: Any) -> Any:
    """What enqueueing an existing key does (see the module's description)."""
    new = ins.excluded
    # No IN (...): expanding parameters cannot go with executemany.
    live = or_(Job.state == JobState.QUEUED, Job.state == JobState.CLAIMED)
    claimed = Job.state == JobState.CLAIMED
    return ins.on_conflict_do_update(
        index_elements=[Job.family_id, Job.key],
        set_={
            # A running job stays claimed; its due_at (cleared by the claim) now
            # says "run once more after this run", at the new due time.
            "state": case((claimed, JobState.CLAIMED), else_=JobState.QUEUED),
            "due_at": new.due_at,
            "payload": new.payload,
            "priority": case(
                (and_(live, Job.priority > new.priority), Job.priority), else_=new.priority
            ),
            "failures": case((live, Job.failures), else_=0),
            "lease_until": case((claimed, Job.lease_until), else_=None),
            "last_error": case((live, Job.last_error), else_=None),
            "updated_at": new.updated_at,
        },
    ).returning(Job.id, Job.key)


def _unnest_upsert() -> Any:
    rows = (
        func.unnest(
            bindparam("keys", type_=postgresql.ARRAY(String)),
            bindparam("payloads", type_=postgresql.ARRAY(Text)),
        )
        .table_valued("k", "p")
        .render_derived()
    )
    source = select(
        bindparam("fid", type_=Integer),
        rows.c.k,
        rows.c.p,
        bindparam("prio", type_=Integer),
        literal(JobState.QUEUED),
        literal(1),
        bindparam("due", type_=DateTime),
        literal(0),
        literal(0),
        bindparam("now", type_=DateTime),
        bindparam("now", type_=DateTime),
    )
    columns = ["family_id", "key", "payload", "priority", "state", "every_n_cycles"]
    columns += ["due_at", "attempts", "failures", "created_at", "updated_at"]
    return _on_conflict(postgresql.insert(Job).from_select(columns, source))


_UPSERT_UNNEST = _unnest_upsert()
_UPSERT_SQLITE = _on_conflict(sqlite.insert(Job))


class _Listener:
    """A dedicated autocommit connection LISTENing on :data:`CHANNEL`."""

    def __init__(self, engine: Engine) -> None:
        raw = engine.raw_connection()
        # Taken before detach(): a detached pool proxy no longer names its driver connection.
        conn = raw.driver_connection
        assert conn is not None
        self.conn: Any = conn
        raw.detach()  # never returned to the pool with a LISTEN on it
        self._raw = raw
        try:
            self.conn.autocommit = True
            self.conn.execute(f"LISTEN {CHANNEL}")
        except Exception:
            raw.close()
            raise
        self.broken = False

    def wait(self, timeout: float) -> bool:
        """True when at least one notification arrived within ``timeout`` s (drains them)."""
        try:
            got = False
            for _ in self.conn.notifies(timeout=timeout, stop_after=1):
                got = True
            if got:
                for _ in self.conn.notifies(timeout=0):
                    pass
            return got
        except Exception as exc:  # noqa: BLE001 - a dropped connection: reconnect later
            log.warning("queue LISTEN connection failed: %s", exc)
            self.close()
            return True  # look once, then poll until a new listener is up

    def close(self) -> None:
        self.broken = True
        try:
            self._raw.close()
        except Exception:  # noqa: BLE001
            pass


# The master's side of the queue lives in its own module; importable from here too.
from .feeder import QueueFeeder as QueueFeeder  # noqa: E402
