"""Cycles asked of the running master through the database (``jodl run`` beside it).

Only one master acts on a database (its lease). A ``jodl run FAMILY`` started
beside a serving master (``jodl master``, ``jodl up``) therefore does not run the
cycle itself: it records a :class:`~jodl.log.models.RunRequest`, the serving master's
:class:`RunRequests` feeder takes it (every :data:`REQUEST_POLL` seconds) and
runs the cycle with :meth:`Master.request_cycle`, and :func:`follow` reports the
run's progress and outcome to the command.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Future

from ..exceptions import JodlError
from ..log.lease import LEASE_SECONDS
from ..log.models import RunRequest
from ..log.records import PendingJob
from ..log.store import Store
from ..master import Feeder, FeedHost, RunSummary
from ..master.outage import RETRY_EVERY, is_outage, reason

log = logging.getLogger("jodl")

#: Seconds between two looks for requests by the serving master.
REQUEST_POLL = 1.0
#: Seconds between two looks at a followed request by the asking command.
FOLLOW_POLL = 0.3
#: Seconds without any master (no lease, no live standby) before a followed request
#: is given up on: two default lease TTLs, the time masters take to lead again after
#: a database restart.
MASTER_GRACE = 2 * LEASE_SECONDS


class RunRequests(Feeder):
    """Takes requested cycles for a serving master and records how they ended.

    A feeder that feeds no jobs itself: its ``claim`` (called once per loop pass)
    hands requests to the master's own cycle queue.
    """

    def __init__(self, store: Store, poll: float = REQUEST_POLL) -> None:
        self.store = store
        self.poll = poll
        self._last = 0.0
        #: The master that takes the requests (its name, from the first claim).
        self._taker = ""
        #: request id -> the cycle's future (from Master.request_cycle).
        self._running: dict[int, Future[RunSummary]] = {}

    def claim(self, master: FeedHost, limit: int) -> list[PendingJob]:
        self._taker = master.name
        self._settle_finished()
        now = time.monotonic()
        if now - self._last >= self.poll:
            self._last = now
            led = master.leadership.families() if master.per_family else None
            for request_id, family in self.store.take_run_requests(master.name, led):
                self._running[request_id] = master.request_cycle(family)
        return []

    def _settle_finished(self) -> None:
        for request_id, future in list(self._running.items()):
            if not future.done():
                continue
            del self._running[request_id]
            exc = future.exception()
            if exc is not None:
                self.store.settle_run_request(request_id, self._taker, error=str(exc))
            else:
                summary = future.result()
                self.store.settle_run_request(
                    request_id,
                    self._taker,
                    run_id=summary.run_id,
                    summary=summary.line(),
                    dead=summary.dead,
                )

    def hand_over(self, families: list[str]) -> None:
        # Their runs ended (the families are idle): settle them before the next leader
        # adopts what is left.
        self._settle_finished()

    def take_over(self, master: FeedHost, families: list[str] | None = None) -> None:
        """Adopt the requests the last leader of ``families`` (None: of all) took and did
        not settle: a request whose family's run is unfinished follows that run
        (resumed by ``master``); one whose run ended before its master could settle it
        is settled with that run's outcome (never run again).
        """
        self._taker = master.name
        running = set(self.store.running_families())
        for request_id, family in self.store.adopt_run_requests(master.name, families):
            if family in running:
                self._running[request_id] = master.request_cycle(family)
            else:
                self._settle_ended(request_id, family)

    def _settle_ended(self, request_id: int, family: str) -> None:
        """Settle an adopted request whose run ended under the last leader."""
        row = self.store.run_request(request_id)
        taken = None if row is None else row.taken_at
        run = None if taken is None else self.store.run_ended_since(family, taken)
        if run is None:
            self.store.settle_run_request(
                request_id,
                self._taker,
                summary=f"run {family}: ended while its master changed (see `jodl status`)",
            )
            return
        summary = RunSummary.of_run(run, family)
        self.store.settle_run_request(
            request_id, self._taker, run_id=run.id, summary=summary.line(), dead=summary.dead
        )

    def close(self) -> None:
        self._settle_finished()
        # Unfinished ones stay taken: the next leader adopts them (take_over) and
        # resumes their runs from the log.
        self._running.clear()


def follow(
    store: Store,
    request_id: int,
    master_alive: Callable[[], bool],
    progress: Callable[[int, int], None] | None = None,
    note: Callable[[str | None], None] | None = None,
) -> RunRequest:
    """Wait for request ``request_id`` to end, reporting its run's progress (and to
    ``note``, each change of why no agent serves it); the request.

    :class:`JodlError` when no master has run for :data:`MASTER_GRACE` seconds and the
    request has no outcome. A database that stops answering (a restart, a failover)
    is waited for, as the masters wait for it.
    """
    outage = False
    alive_at = time.monotonic()
    said: list[str | None] = [None]

    def tell(unserved: str | None) -> None:
        if note is not None and unserved != said[0]:
            said[0] = unserved
            note(unserved)

    while True:
        try:
            row = _look(store, request_id, progress, tell)
            alive = row is None and master_alive()
        except Exception as exc:
            if not is_outage(exc):
                raise
            if not outage:
                log.warning("the database does not answer (%s): waiting for it", reason(exc))
            outage = True
            alive_at = time.monotonic()  # masters lead again once it answers
            time.sleep(RETRY_EVERY)
            continue
        outage = False
        if row is not None:
            return row
        if alive:
            alive_at = time.monotonic()
        elif time.monotonic() - alive_at > MASTER_GRACE:
            row = store.run_request(request_id)
            if row is not None and row.finished_at is not None:
                return row
            raise JodlError("the running master stopped before the run ended")
        time.sleep(FOLLOW_POLL)


def _look(
    store: Store,
    request_id: int,
    progress: Callable[[int, int], None] | None,
    tell: Callable[[str | None], None],
) -> RunRequest | None:
    """One look at a followed request: the request once it ended, else None (its run's
    progress and why no agent serves it, if so, reported meanwhile)."""
    row = store.run_request(request_id)
    if row is None:
        raise JodlError(f"run request {request_id} disappeared")
    if row.finished_at is not None:
        return row
    if row.taken_at is not None:
        run = store.running_run(row.family)
        if run is not None and progress is not None and run.jobs_total:
            done, _ = store.count_run(run.id)
            progress(min(done, run.jobs_total), run.jobs_total)
        if run is not None:
            tell(run.unserved)
    return None
