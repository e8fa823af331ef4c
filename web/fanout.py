"""One look at the log per notice for every open batch stream, handed out in memory.

Each open batch stream (``web/stream.py``) registers the items it still waits for
in an :class:`Inbox`. One thread per process, the :class:`Fanout`'s, holds one
subscription to the :class:`~jodl.log.ResultWatch` covering the jobs of every
inbox. When a notice names some of them, it reads their new results in **one**
query and hands each result to the inboxes waiting on its job; each stream takes
from its own inbox only, so it never sees a result of another batch. A stream's
first look (what committed before it opened) is the fan-out's next look too, shared
by the streams that open meanwhile. A stream with
nothing new does no query; idle streams cost nothing but the fan-out's own safety
look (one per process every :data:`SAFETY_POLL` seconds, for what no notice tells:
a job deleted, a notice lost). Where no notices come (SQLite with the master in
another process, the listening connection down) the fan-out polls every
``JODL_WEB_STREAM_POLL`` seconds, still one query for all streams.

Why, measured with ``bench/sse.py`` (50 streams, 1,000 URLs, 2 cores busy with other
work): when every woken stream looked at the log itself, that look was the largest
part of the time from commit to event (median 13-24 ms), most of it three round
trips (the pool's pre-ping, the query, the reset on return) each waiting for a CPU.
The fan-out reads on a connection of its own, in autocommit and without pre-ping:
one round trip per look, and one look per notice however many streams wait. Run by
turns under load, 50 streams' p95 went from 13-28 ms to 8-19 ms; on a quiet machine
both were 10-12 ms.

Memory is bounded: an inbox holds at most :data:`INBOX_MAX` answers. A stream whose
client reads slowly and falls that far behind is marked :attr:`Inbox.behind`: the
fan-out keeps its items registered but hands it nothing more, and the stream
catches up from the database with one query of its own, then carries on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any, NamedTuple

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from jodl.log import DoneResult, JobError, JobState, Reads, ResultWatch, Subscription, make_engine

from .batch import Item, decode, describe

log = logging.getLogger("web.fanout")

#: Answers an inbox holds before its stream must catch up from the database instead:
#: a few screens of results, so a slow client costs at most this many rows of memory.
INBOX_MAX = 256
#: Seconds between two looks at every waited-for job, when notices come: a safety net
#: for what no notice tells (a job deleted) or a notice lost. One query per process.
SAFETY_POLL = 5.0
#: Longest pause between two looks while the database does not answer (seconds).
DB_BACKOFF_MAX = 5.0


class Answer(NamedTuple):
    """A result (or the reason none will come) for one item of one stream."""

    item: Item
    result: DoneResult | None
    gave_up: JobError | None = None

    def event(self) -> dict[str, Any]:
        """The stream's event for it."""
        if self.result is not None:
            return describe(
                self.item, decode(self.result.result), checked_at=self.result.finished_at
            )
        assert self.gave_up is not None
        why = self.gave_up.error or (
            "deleted" if self.gave_up.state == JobState.DELETED else "failed"
        )
        return describe(self.item, None, error=f"gave up: {why}")


class Inbox:
    """One stream's share of the fan-out.

    ``items`` (job id -> item still waited for) and ``answers`` (handed over, not yet
    sent; at most :data:`INBOX_MAX`) are guarded by the fan-out's lock; ``ready`` is set
    when answers arrive or the stream must catch up (``behind``)."""

    def __init__(self, items: dict[int, Item]) -> None:
        self.items = items
        self.answers: deque[Answer] = deque()
        self.behind = False
        self.ready = threading.Event()


class Fanout:
    """The process's fan-out of new results to the open batch streams (module doc)."""

    def __init__(
        self, engine: Engine, watch: ResultWatch, stopping: threading.Event, poll: float
    ) -> None:
        self.engine = engine
        self.watch = watch
        self.stopping = stopping
        self.poll = poll
        self._lock = threading.Lock()
        #: job id -> inboxes waiting for it.
        self._by_job: dict[int, set[Inbox]] = {}
        self._sub: Subscription | None = None
        #: Jobs of inboxes opened since the last look: looked at next, notice or not.
        self._fresh: set[int] = set()
        self._reads: Reads | None = None
        self._thread: threading.Thread | None = None
        #: Looks at the log made (each one query for results, maybe one for given-up jobs).
        self.looks = 0
        self._looking = False

    @property
    def busy(self) -> bool:
        """A look is due for streams just opened, or under way."""
        with self._lock:
            return bool(self._fresh) or self._looking

    @property
    def waiting(self) -> int:
        """Inboxes of open streams that still wait for a result."""
        with self._lock:
            return len({i for waiting in self._by_job.values() for i in waiting})

    # -- the streams' side ---------------------------------------------------------------------

    def open(self, items: Iterable[Item]) -> Inbox:
        """An inbox for these pending items, registered before the stream's first look (a
        result committed meanwhile reaches it either way)."""
        inbox = Inbox({i.job_id: i for i in items if i.job_id is not None})
        with self._lock:
            sub = self._start()
            for jid in inbox.items:
                self._by_job.setdefault(jid, set()).add(inbox)
            sub.add(inbox.items)
            # The stream's first look is the fan-out's too (module doc).
            self._fresh.update(inbox.items)
        if inbox.items:
            sub.woken.set()
        return inbox

    def take(self, inbox: Inbox) -> tuple[list[Answer], bool]:
        """The answers handed to ``inbox`` since the last call, and whether the stream
        fell behind (then it must look at the log itself: :meth:`settle` what it found)."""
        with self._lock:
            inbox.ready.clear()
            answers = list(inbox.answers)
            inbox.answers.clear()
            behind, inbox.behind = inbox.behind, False
        return answers, behind

    def settle(self, inbox: Inbox, items: Iterable[Item]) -> None:
        """These items of ``inbox`` were answered by the stream's own look."""
        with self._lock:
            self._forget(inbox, [i.job_id for i in items if i.job_id is not None])

    def close(self, inbox: Inbox) -> None:
        """The stream ended: forget its inbox."""
        with self._lock:
            self._forget(inbox, list(inbox.items))

    # -- the fan-out's thread ----------------------------------------------------------------

    def _start(self) -> Subscription:
        # Under the lock.
        if self._sub is None:
            self._sub = self.watch.subscribe(())
            self._thread = threading.Thread(target=self._run, name="web-fanout", daemon=True)
            self._thread.start()
        return self._sub

    def _forget(self, inbox: Inbox, job_ids: list[int]) -> None:
        # Under the lock.
        done = []
        for jid in job_ids:
            inbox.items.pop(jid, None)
            waiting = self._by_job.get(jid)
            if waiting is None:
                continue
            waiting.discard(inbox)
            if not waiting:
                del self._by_job[jid]
                done.append(jid)
        if done and self._sub is not None:
            self._sub.drop(done)

    def _run(self) -> None:
        assert self._sub is not None
        sub = self._sub
        next_safety = time.monotonic() + SAFETY_POLL
        backoff = 0.0
        missed = False
        try:
            while not self.stopping.is_set() and not self.watch.closed:
                live = self.watch.live
                now = time.monotonic()
                pause = (next_safety - now) if live else self.poll
                sub.wait(max(0.0, max(pause, backoff)))
                noticed = sub.take()
                with self._lock:
                    fresh, self._fresh = self._fresh, set()
                    self._looking = True
                now = time.monotonic()
                everything = missed or noticed.everything or not live or now >= next_safety
                if not everything and not noticed.job_ids and not fresh:
                    with self._lock:
                        self._looking = False
                    continue
                try:
                    if everything:
                        self._look(None)
                    else:
                        self._look(noticed.job_ids | fresh, give_up=noticed.job_ids)
                    backoff = 0.0
                    missed = False
                except Exception as exc:  # noqa: BLE001 - no stream may be left hanging
                    # The database is away for a moment: look at everything once it is back.
                    backoff = min(DB_BACKOFF_MAX, max(backoff * 2, 0.1))
                    missed = True
                    log.warning(
                        "stream fan-out cannot read the log (retry in %.1fs): %s",
                        backoff,
                        exc,
                        exc_info=not isinstance(exc, SQLAlchemyError),
                    )
                finally:
                    with self._lock:
                        self._looking = False
                if everything:
                    next_safety = time.monotonic() + SAFETY_POLL
        finally:
            with self._lock:
                self._sub = None
                self._thread = None
                inboxes = {i for waiting in self._by_job.values() for i in waiting}
            sub.close()
            for inbox in inboxes:
                inbox.ready.set()  # streams notice the stop themselves
            if self._reads is not None and self._reads.engine is not self.engine:
                self._reads.engine.dispose()
            self._reads = None

    def _reader(self) -> Reads:
        if self._reads is None:
            if self.engine.dialect.name == "postgresql":
                # One connection for this one thread: no pre-ping, no reset on return.
                url = self.engine.url.render_as_string(hide_password=False)
                own = make_engine(
                    url,
                    pool_size=1,
                    max_overflow=0,
                    pool_pre_ping=False,
                    isolation_level="AUTOCOMMIT",
                )
                self._reads = Reads(own)
            else:
                self._reads = Reads(self.engine)
        return self._reads

    def _look(self, job_ids: Iterable[int] | None, give_up: Iterable[int] | None = None) -> None:
        """Read the new results of these jobs (None: of every waited-for job) in one
        query, hand them out; then those given up on among the jobs ``give_up`` (None:
        all of them) still waited for (a notice that brought no result: the job failed,
        dead perhaps, or was re-run)."""
        with self._lock:
            waited = self._by_job
            jobs = list(waited) if job_ids is None else [j for j in job_ids if j in waited]
            floors: dict[int, list[int]] = {}
            for jid in jobs:
                lowest = min(i.items[jid].after_exec_id for i in self._by_job[jid])
                floors.setdefault(lowest, []).append(jid)
        if not floors:
            return
        reads = self._reader()
        self.looks += 1
        rows = reads.results_after(floors)
        woken: set[Inbox] = set()
        with self._lock:
            for row in rows:
                for inbox in list(self._by_job.get(row.job_id, ())):
                    item = inbox.items.get(row.job_id)
                    if item is not None and row.exec_id > item.after_exec_id:
                        self._hand(inbox, Answer(item, row))
                        woken.add(inbox)
            asked = jobs if give_up is None else [j for j in give_up if j in self._by_job]
            rest = [jid for jid in asked if jid in self._by_job]
        if rest:
            errors = reads.given_up(rest)
            with self._lock:
                for error in errors:
                    for inbox in list(self._by_job.get(error.job_id, ())):
                        item = inbox.items.get(error.job_id)
                        if item is not None:
                            self._hand(inbox, Answer(item, None, error))
                            woken.add(inbox)
        for inbox in woken:
            inbox.ready.set()

    def _hand(self, inbox: Inbox, answer: Answer) -> None:
        # Under the lock. A full inbox gets nothing more: its stream catches up itself.
        if len(inbox.answers) >= INBOX_MAX:
            inbox.behind = True
            return
        inbox.answers.append(answer)
        assert answer.item.job_id is not None
        self._forget(inbox, [answer.item.job_id])
