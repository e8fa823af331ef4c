"""The public API of the on-demand queue (:class:`Queue`) and its settings.

What the queue promises (unique keys, due times, priorities, leases, attempts,
dead letters) is described in :mod:`jodl.queue`; the statements that keep those
promises live in :mod:`jodl.log.queue_sql`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sqlalchemy import Engine

from ..agent.codec import loads_object
from ..exceptions import BadPayload, JodlError
from ..family import check_payloads
from ..log.engine import make_engine
from ..log.listener import Listener
from ..log.models import JobState, utcnow
from ..log.outcomes import retry_delay
from ..log.queue_records import Claimed, QueuedJob
from ..log.queue_sql import QueueSQL
from ..log.store import Store
from ..obs import tracing
from ..settings.config import DEFAULT_MAX_ATTEMPTS, read_values
from ..settings.options import Option, register_options

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
# Listed in the configuration table under the package that documents them.
register_options(OPTIONS, "jodl.queue")

_NOTHING: Any = object()

Payload = Mapping[str, Any] | str | None


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
        #: Every statement the queue runs (jodl/log/queue_sql.py).
        self.sql = QueueSQL(self.engine)
        self._lock = threading.Lock()
        self._listener: Listener | None = None
        tracing.configure()  # JODL_TRACES, unless this process set traces up already

    def family_id(self, name: str, create: bool = False) -> int | None:
        """The id of family ``name`` (created when ``create``), None if there is none."""
        return self.sql.family_id(name, create)

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

        An existing key is updated in place (see :mod:`jodl.queue`); the job's
        id is returned either way.
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
        check_payloads(family, payloads.items(), lambda n, key: f"job {key!r}")
        fid = self.sql.family_id(family, create=True)
        assert fid is not None
        ids = self.sql.enqueue(fid, family, payloads, int(priority), due, now)
        if tracing.state.on:
            tracing.added(family, ((key, ids[key]) for key in payloads), "enqueue")
        return [ids[k] for k in payloads]

    # -- claim --------------------------------------------------------------------------------

    def claim(
        self, limit: int = 1, lease: float = DEFAULT_LEASE, families: Iterable[str] | None = None
    ) -> list[Claimed]:
        """Take up to ``limit`` due jobs (highest priority, then earliest due) for ``lease`` s.

        A family with an on-demand budget (:mod:`jodl.admin.budget`) gives at most its
        budget's jobs per clock hour; its other jobs stay queued.
        """
        names = None if families is None else list(families)
        if limit <= 0 or names == []:
            return []
        now = self.clock()
        return self.sql.claim(limit, now, now + dt.timedelta(seconds=lease), names)

    def extend(self, claims: Iterable[tuple[int, int]], lease: float = DEFAULT_LEASE) -> set[int]:
        """Renew the leases of (job_id, attempt) claims; the ids still claimed by them."""
        pairs = list(claims)
        if not pairs:
            return set()
        return self.sql.extend(pairs, self.clock() + dt.timedelta(seconds=lease))

    def still_claimed(self, claims: Iterable[tuple[int, int]]) -> set[int]:
        """Which (job_id, attempt) claims still hold their job (read only)."""
        return self.sql.still_claimed(list(claims))

    # -- outcomes ------------------------------------------------------------------------------

    def complete(self, job_id: int, attempt: int, result: Any = _NOTHING) -> bool:
        """Mark the job done if ``attempt`` still holds it; False (and no change) otherwise.

        A JSON ``result``, when given, is kept as the attempt's execution row
        (what :meth:`result` returns), in the same transaction.
        """
        if result is _NOTHING:
            return self.sql.complete(job_id, attempt, None, "")
        # The id first: its allocation commits on its own (SQLite has one writer).
        exec_id = self.sql.next_exec_id()
        return self.sql.complete(job_id, attempt, exec_id, json.dumps(result))

    def complete_many(self, claims: Iterable[tuple[int, int]]) -> int:
        """Mark many (job_id, attempt) claims done in one transaction; how many were held."""
        pairs = list(claims)
        if not pairs:
            return 0
        return self.sql.complete_many(pairs)

    def fail(self, job_id: int, attempt: int, error: str, retryable: bool = True) -> str | None:
        """Record a failure of ``attempt``: the job's new state (queued or dead), or None.

        None means the attempt no longer held the job: nothing changed. A
        retryable failure queues the job again after a backoff, until its
        family's ``max_attempts`` failures in all make it dead.
        """

        def due_for(failures: int, family_max: int | None) -> dt.datetime | None:
            if not retryable or failures >= (family_max or self.max_attempts):
                return None  # dead
            return self.clock() + dt.timedelta(seconds=retry_delay(failures))

        return self.sql.fail(job_id, attempt, str(error), due_for)

    def release(self, claims: Iterable[tuple[int, int]]) -> int:
        """Give back (job_id, attempt) claims that never ran: queued again, no failure counted."""
        pairs = list(claims)
        if not pairs:
            return 0
        return self.sql.release(pairs, self.clock())

    def release_expired(self) -> int:
        """Queue again (or kill) claimed jobs whose lease ended; how many there were.

        An ended lease counts as a failure of that attempt: the holder died or
        lost touch, and the job may have run partly.
        """
        count = self.sql.release_expired(self.clock(), self.max_attempts)
        if count:
            log.info("%d on-demand jobs came back after their lease ended", count)
        return count

    # -- management ----------------------------------------------------------------------------

    def delete(self, family: str, key: str) -> bool:
        """Delete a job: never dispatched again (a running attempt is cancelled by its master)."""
        fid = self.sql.family_id(family)
        if fid is None:
            return False
        return self.sql.delete(fid, key, self.clock())

    def requeue_dead(self, family: str, keys: Iterable[str] | None = None) -> int:
        """Queue dead jobs of ``family`` again (all, or those ``keys``), due now, fresh budget."""
        fid = self.sql.family_id(family)
        if fid is None:
            return 0
        chosen = None if keys is None else list(keys)
        return self.sql.requeue_dead(fid, family, chosen, self.clock())

    def counts(self, family: str | None = None) -> dict[str, dict[str, int]]:
        """Per family: queued (waiting, due or not), running (claimed), overdue (due
        now and not taken yet), dead and done jobs."""
        out: dict[str, dict[str, int]] = {}
        for name, state, count, due in self.sql.counts(self.clock(), family):
            entry = out.setdefault(
                name, {"queued": 0, "running": 0, "overdue": 0, "dead": 0, "done": 0}
            )
            if state == JobState.QUEUED:
                entry["queued"] = count
                entry["overdue"] = due
            elif state == JobState.CLAIMED:
                entry["running"] = count
            else:
                entry[state] = count
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
        return self.sql.jobs(family, state, limit, key)

    def get(self, family: str, key: str) -> QueuedJob | None:
        """The job ``key`` of ``family`` in any state (deleted and cycle jobs too), or None."""
        fid = self.sql.family_id(family)
        if fid is None:
            return None
        return self.sql.get(fid, key)

    def result(self, family: str, key: str) -> Any:
        """The result of the job's latest successful attempt (decoded JSON), or None."""
        fid = self.sql.family_id(family)
        if fid is None:
            return None
        text_ = self.sql.result(fid, key)
        return json.loads(text_) if text_ else None

    def next_due(self, families: Iterable[str] | None = None) -> dt.datetime | None:
        """The earliest due time among queued jobs (of ``families``), or None."""
        names = None if families is None else list(families)
        return self.sql.next_due(names) if names != [] else None

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

    def _listen(self) -> Listener | None:
        with self._lock:
            if self._listener is None or self._listener.broken:
                try:
                    self._listener = Listener(self.engine)
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
