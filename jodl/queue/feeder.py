"""The master's side of the on-demand queue: claim due jobs, keep their leases, drop deleted ones.

A :class:`QueueFeeder` is added to :attr:`Master.feeders`; :meth:`Master.serve`
asks it once per loop step for as many jobs as it has room for, and places and
runs them like jobs of a cycle. Claiming runs in a background thread, so the
database round trips of a claim overlap with the master's own work: the thread
keeps a small buffer of claimed jobs filled while the master has room, and when
nothing is due it sleeps until an enqueue is notified (PostgreSQL ``LISTEN``),
the next due time comes, or a short poll (SQLite).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque

from ..log.notices import HERE
from ..log.queue_records import Claimed
from ..log.records import NO_NODES, PendingJob
from ..master import Feeder, FeedHost
from ..settings.config import read_values
from .queue import CHECK_INTERVAL, CLAIM_BATCH, OPTIONS, WAKE_MAX, Queue

log = logging.getLogger("jodl.feeder")


class QueueFeeder(Feeder):
    """Feeds a serving master with due jobs of the queue (see :meth:`Master.serve`).

    Only jobs of families that some connected agent runs are claimed. Once per
    ``check_interval`` it asks the database which of its claims still hold their
    job: jobs deleted (or lost to another claim after a stall) are dropped by the
    master and cancelled on their agents. It renews its leases every third of
    the lease and queues again the jobs of any holder whose lease ended.
    ``prefetch=False`` claims in the master's thread instead (one step at a time).
    """

    def __init__(
        self,
        queue: Queue,
        lease: float | None = None,
        check_interval: float = CHECK_INTERVAL,
        prefetch: bool = True,
    ) -> None:
        self.queue = queue
        self.lease = lease if lease is not None else read_values(OPTIONS)["queue_lease"]
        self.check_interval = check_interval
        self.prefetch = prefetch
        #: job_id -> claimed attempt of the jobs this feeder handed to the master.
        self.held: dict[int, int] = {}
        self._next_check = 0.0
        self._next_renew = time.monotonic() + self.lease / 3
        self._cond = threading.Condition()
        self._buffer: deque[Claimed] = deque()
        self._want = 0
        self._families: tuple[str, ...] = ()
        self._thread: threading.Thread | None = None
        #: The master this feeder claims for (woken when claims wait in the buffer).
        self._host: FeedHost | None = None
        self._closing = False
        # The results of the jobs it claims commit in this process: watches here hear of
        # them without polling, SQLite included (jodl.log.notices).
        self._writing = contextlib.ExitStack()
        self._writing.enter_context(HERE.writing(queue.engine))

    # -- the master's thread ----------------------------------------------------------------

    def claim(self, master: FeedHost, limit: int) -> list[PendingJob]:
        now = time.monotonic()
        if now >= self._next_check:
            self._next_check = now + self.check_interval
            self.check(master)
        usable = {f for s in master.nodes.values() if s.usable for f in s.families}
        families = tuple(sorted(f for f in usable if master.leads(f)))
        if not self.prefetch:
            got = (
                self.queue.claim(min(limit, CLAIM_BATCH), self.lease, families) if families else []
            )
        else:
            with self._cond:
                self._families = families
                got = [self._buffer.popleft() for _ in range(min(limit, len(self._buffer)))]
                self._want = min(limit - len(got), CLAIM_BATCH)
                self._cond.notify()
            if self._thread is None:
                self._host = master
                self._thread = threading.Thread(target=self._run, name="queue-claims", daemon=True)
                self._thread.start()
        foreign = [(job.id, job.attempt) for job in got if not master.leads(job.family)]
        if foreign:  # claimed before their family moved to another master: theirs now
            self.queue.release(foreign)
            got = [job for job in got if master.leads(job.family)]
        for job in got:
            self.held[job.id] = job.attempt
        return [
            PendingJob(
                job.id,
                job.key,
                job.family,
                job.payload,
                job.priority,
                None,
                job.permanent_node_id,
                job.trial_node_id,
                job.failures,
                NO_NODES,
                job.attempt,
            )
            for job in got
        ]

    def check(self, master: FeedHost) -> None:
        """Drop jobs no longer claimed by us; renew leases when due; release ended ones."""
        held = {
            job_id: attempt
            for job_id, attempt in self.held.items()
            if (job := master.pending.get(job_id)) is not None and job.claim == attempt
        }
        self.held = held
        now = time.monotonic()
        renew = now >= self._next_renew
        if renew:
            self._next_renew = now + self.lease / 3
        if held:
            if renew:
                still = self.queue.extend(held.items(), self.lease)
            else:
                still = self.queue.still_claimed(held.items())
            lost = [job_id for job_id in held if job_id not in still]
            if lost:
                log.info("%d on-demand jobs deleted or taken over: cancelling them", len(lost))
                master.cancel(lost, "job deleted or claimed by another attempt")
                for job_id in lost:
                    held.pop(job_id, None)
        if renew:
            with self._cond:
                waiting = [(job.id, job.attempt) for job in self._buffer]
            if waiting:  # claims waiting in the buffer keep their lease too
                self.queue.extend(waiting, self.lease)
        self.queue.release_expired()

    def close(self) -> None:
        """Stop claiming and give back every claim still open, with no failure counted.

        Called by :meth:`Master.close` once its results are committed: jobs it
        had not finished (unsent, or still running on an agent) are queued again
        at once instead of waiting for their lease to end; one that was running
        may run again (at least once).
        """
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)
        with self._cond:
            left = [(job.id, job.attempt) for job in self._buffer]
            self._buffer.clear()
        left += list(self.held.items())  # those done meanwhile are no longer claimed
        self.held = {}
        if left:
            self.queue.release(left)
        self.queue.close()
        self._writing.close()

    # -- the claiming thread ------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closing and (not self._families or len(self._buffer) >= self._want):
                    self._cond.wait(WAKE_MAX)
                if self._closing:
                    return
                want = self._want - len(self._buffer)
                families = self._families
            try:
                got = self.queue.claim(want, self.lease, families)
            except Exception as exc:  # noqa: BLE001 - the database may come back
                log.warning("claiming on-demand jobs failed: %s", exc)
                time.sleep(WAKE_MAX)
                continue
            with self._cond:
                if self._closing:
                    self._buffer.extend(got)  # given back by close()
                    return
                self._buffer.extend(got)
            if got and self._host is not None:
                self._host.wake()  # placed at once, not after the master's pause
            if len(got) < want:
                # Nothing more is due: sleep until an enqueue, the next due time or a poll.
                self.queue.wait(WAKE_MAX, families)
