"""Notices of committed results: which on-demand jobs just ended, for whoever waits on them.

Every statement that ends claims of on-demand jobs (:func:`~jodl.log.outcomes.close_claims`,
from the master's outcome batches or from :class:`~jodl.queue.Queue` consumers)
announces their job ids with :func:`announce` inside its transaction:

* on PostgreSQL as ``NOTIFY`` on :data:`CHANNEL` (payload: job ids separated by
  spaces), which the server delivers to every listening process at the commit and
  never before it;
* in this process, after the commit (:func:`begin`), to the :data:`HERE` hub. SQLite
  has no ``NOTIFY``: a waiter on SQLite hears only of commits made in its own
  process (``jodl up`` runs the master beside the web UI), and knows whether such a
  writer runs here (:meth:`LocalNotices.writes_here`, set by the queue feeder of a
  master). When none does, it polls instead.

A reader waits with one :class:`ResultWatch` per process and database (one
``LISTEN`` connection, held by one thread, on PostgreSQL) and one
:class:`Subscription` per waiter, woken only by the jobs it names; it can ask which
of them ended (:meth:`Subscription.take`), so that one waiter can look on behalf of
many (an application's fan-out to its open event streams). A notice says
"look again", never what the result is: the waiter reads the log as before, so a
lost notice costs latency (until the waiter's own safety poll), never a result.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from sqlalchemy import Connection, Engine, event, text

from .listener import Listener

log = logging.getLogger("jodl.notices")

#: The PostgreSQL channel of ended on-demand jobs (payload: job ids, space-separated).
CHANNEL = "jodl_results"
#: Longest payload of one NOTIFY (PostgreSQL refuses 8,000 bytes and more).
PAYLOAD_MAX = 7900
#: Seconds between two looks of the listening thread at whether it must stop (a select
#: timeout: no query), so that closing a watch closes its connection about as fast.
LISTEN_TICK = 0.25
#: First and longest pause before the listening thread connects again after a failure
#: (seconds; doubled at each failure in between).
RECONNECT_FIRST = 1.0
RECONNECT_MAX = 10.0
#: Key of the job ids announced in a transaction of :func:`begin` (``Connection.info``).
_PENDING = "jodl_notices"


def database_key(engine: Engine) -> str:
    """Which database ``engine`` names, the same for every engine on it in this process."""
    url = engine.url
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        return "sqlite:" + os.path.realpath(str(url.database))
    return url.set(drivername=url.get_backend_name()).render_as_string(hide_password=True)


def announce(conn: Connection, job_ids: Iterable[int]) -> None:
    """Announce, with the transaction of ``conn``, that these jobs have a new outcome."""
    ids = sorted(set(job_ids))
    if not ids:
        return
    pending = conn.info.get(_PENDING)
    if pending is not None:
        pending.update(ids)
    if conn.dialect.name != "postgresql":
        return
    payloads: list[str] = []
    chunk: list[str] = []
    size = 0
    for jid in ids:
        word = str(jid)
        if size + len(word) + 1 > PAYLOAD_MAX:
            payloads.append(" ".join(chunk))
            chunk, size = [], 0
        chunk.append(word)
        size += len(word) + 1
    payloads.append(" ".join(chunk))
    # Every payload in one statement: a batch of 1,400 results needs two, and each
    # statement is a round trip in the log writer's commit.
    conn.execute(_NOTIFY_ALL, {"c": CHANNEL, "ps": payloads})


_NOTIFY_ALL = text("SELECT pg_notify(:c, p) FROM unnest(CAST(:ps AS text[])) AS p")


@contextlib.contextmanager
def begin(engine: Engine) -> Iterator[Connection]:
    """``engine.begin()``; after its commit, :data:`HERE` hears what it announced."""
    announced: set[int] = set()
    with engine.begin() as conn:
        conn.info[_PENDING] = announced
        try:
            yield conn
        finally:
            conn.info.pop(_PENDING, None)
    if announced:
        HERE.publish(database_key(engine), announced)


class LocalNotices:
    """This process's hub: commits announced here reach the watches of this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: database key -> watches of this process on it.
        self._watches: dict[str, set[ResultWatch]] = {}
        #: database key -> writers of on-demand outcomes running in this process.
        self._writers: dict[str, int] = {}

    def publish(self, key: str, job_ids: set[int]) -> None:
        with self._lock:
            watches = list(self._watches.get(key, ()))
        for watch in watches:
            watch.dispatch(job_ids)

    def attach(self, key: str, watch: ResultWatch) -> None:
        with self._lock:
            self._watches.setdefault(key, set()).add(watch)

    def detach(self, key: str, watch: ResultWatch) -> None:
        with self._lock:
            self._watches.get(key, set()).discard(watch)

    @contextlib.contextmanager
    def writing(self, engine: Engine) -> Iterator[None]:
        """While inside, outcomes of on-demand jobs on ``engine``'s database commit here."""
        key = database_key(engine)
        with self._lock:
            self._writers[key] = self._writers.get(key, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._writers[key] -= 1

    def writes_here(self, key: str) -> bool:
        with self._lock:
            return self._writers.get(key, 0) > 0


#: The hub of this process.
HERE = LocalNotices()


class Noticed(NamedTuple):
    """What a subscription heard since it last asked (:meth:`Subscription.take`)."""

    #: Its jobs that ended.
    job_ids: frozenset[int]
    #: Notices may have been missed (the listener reconnected, the watch closed): look
    #: at every job.
    everything: bool


class Subscription:
    """One waiter's interest in some jobs: :meth:`wait` returns early when one of them ends,
    and :meth:`take` tells which did."""

    def __init__(self, watch: ResultWatch, job_ids: Iterable[int]) -> None:
        self.watch = watch
        self.job_ids: frozenset[int] = frozenset(job_ids)
        self.woken = threading.Event()
        # Guarded by the watch's lock.
        self._noticed: set[int] = set()
        self._everything = False

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for a notice; True when one came (then cleared)."""
        got = self.woken.wait(timeout)
        self.woken.clear()
        return got

    def take(self) -> Noticed:
        """The jobs of this subscription that ended since the last call (then forgotten)."""
        return self.watch._take(self)

    def keep(self, job_ids: Iterable[int]) -> None:
        """Wait for these jobs only from now on (those answered meanwhile drop out)."""
        self.watch._rebind(self, frozenset(job_ids))

    def add(self, job_ids: Iterable[int]) -> None:
        """Wait for these jobs too."""
        self.watch._rebind(self, self.job_ids | frozenset(job_ids))

    def drop(self, job_ids: Iterable[int]) -> None:
        """No longer wait for these jobs."""
        self.watch._rebind(self, self.job_ids - frozenset(job_ids))

    def close(self) -> None:
        self.watch._rebind(self, frozenset())


class ResultWatch:
    """This process's watch over one database's ended on-demand jobs (see the module doc).

    ``live`` says whether notices arrive: the ``LISTEN`` connection is up
    (PostgreSQL), or a writer of on-demand outcomes runs in this process (SQLite).
    While it is False a waiter must poll. The listening thread starts with the first
    subscription; ``close`` (or ``stopping``, once set) stops it and wakes every waiter.
    """

    def __init__(self, engine: Engine, stopping: threading.Event | None = None) -> None:
        self.engine = engine
        self.key = database_key(engine)
        self.postgres = engine.dialect.name == "postgresql"
        self.stopping = stopping
        self._lock = threading.Lock()
        #: job id -> subscriptions waiting for it; subscription -> its job ids.
        self._by_job: dict[int, set[Subscription]] = {}
        self._subs: dict[Subscription, frozenset[int]] = {}
        self._listening = False
        self._closed = threading.Event()
        self._started = False
        self._thread: threading.Thread | None = None
        self.notices = 0
        if not self.postgres:
            HERE.attach(self.key, self)
        # A disposed engine ends its watch (no thread left trying a database gone).
        event.listen(engine, "engine_disposed", self._disposed)

    @property
    def closed(self) -> bool:
        """True once the watch is closed (its engine disposed, or ``stopping`` set)."""
        return self._closed.is_set()

    @property
    def live(self) -> bool:
        if self._closed.is_set():
            return False
        return self._listening if self.postgres else HERE.writes_here(self.key)

    def subscribe(self, job_ids: Iterable[int]) -> Subscription:
        """A subscription to these jobs (close it when done)."""
        self._start()
        sub = Subscription(self, ())
        self._rebind(sub, frozenset(job_ids))
        if self._closed.is_set():
            sub.woken.set()
        return sub

    def dispatch(self, job_ids: Iterable[int]) -> None:
        """Wake the subscriptions of these jobs."""
        ids = set(job_ids)
        with self._lock:
            self.notices += 1
            woken = {s for jid in ids for s in self._by_job.get(jid, ())}
            for sub in woken:
                sub._noticed.update(ids & sub.job_ids)
        for sub in woken:
            sub.woken.set()

    def wake_all(self) -> None:
        with self._lock:
            subs = list(self._subs)
            for sub in subs:
                sub._everything = True
        for sub in subs:
            sub.woken.set()

    def close(self) -> None:
        """Stop listening (the connection closed once this returns) and wake every waiter."""
        self._closed.set()
        if not self.postgres:
            HERE.detach(self.key, self)
        self.wake_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=LISTEN_TICK * 4)

    # -- internals ---------------------------------------------------------------------------

    def _take(self, sub: Subscription) -> Noticed:
        with self._lock:
            noticed = Noticed(frozenset(sub._noticed), sub._everything)
            sub._noticed.clear()
            sub._everything = False
        return noticed

    def _rebind(self, sub: Subscription, job_ids: frozenset[int]) -> None:
        with self._lock:
            for jid in self._subs.pop(sub, frozenset()) - job_ids:
                subs = self._by_job.get(jid)
                if subs is not None:
                    subs.discard(sub)
                    if not subs:
                        del self._by_job[jid]
            if job_ids:
                self._subs[sub] = job_ids
                for jid in job_ids:
                    self._by_job.setdefault(jid, set()).add(sub)
            sub.job_ids = job_ids
            sub._noticed &= job_ids

    def _start(self) -> None:
        with self._lock:
            if self._started or self._closed.is_set():
                return
            self._started = True
        if self.postgres:
            self._thread = threading.Thread(target=self._listen, name="jodl-notices", daemon=True)
            self._thread.start()
        if self.stopping is not None:
            stop = threading.Thread(target=self._close_on_stop, name="jodl-stop", daemon=True)
            stop.start()

    def _disposed(self, _engine: Engine) -> None:
        self.close()

    def _close_on_stop(self) -> None:
        assert self.stopping is not None
        self.stopping.wait()
        self.close()

    def _listen(self) -> None:
        pause = RECONNECT_FIRST
        while not self._closed.is_set():
            try:
                listener = Listener(self.engine, CHANNEL)
            except Exception as exc:  # noqa: BLE001 - the database may come back
                log.warning("cannot LISTEN for results (retry in %.0fs): %s", pause, exc)
                self._closed.wait(pause)
                pause = min(RECONNECT_MAX, pause * 2)
                continue
            pause = RECONNECT_FIRST
            if self._closed.is_set():
                listener.close()
                return
            self._listening = True
            self.wake_all()  # what committed while no one listened: everyone looks once
            try:
                while not self._closed.is_set():
                    payloads = listener.payloads(LISTEN_TICK)
                    if payloads:
                        self.dispatch(_job_ids(payloads))
            except Exception as exc:  # noqa: BLE001 - a dropped connection: connect again
                log.warning("the LISTEN connection for results failed: %s", exc)
            finally:
                self._listening = False
                listener.close()
                self.wake_all()  # waiters poll until the listener is back


def _job_ids(payloads: list[Any]) -> set[int]:
    out: set[int] = set()
    for payload in payloads:
        out.update(int(word) for word in str(payload).split() if word.isdigit())
    return out
