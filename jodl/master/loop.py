"""The master: runs cycles of job families on agents, one thread, polling.

:meth:`Master.step` is the loop, one pass, top to bottom (docs/architecture.md#the-master-loop):

    keep_lease       renew the master lease (fenced if another master took it)
    refresh nodes    connect new agents, retry unreachable ones (backoff), drop removed ones
    assign           place jobs that need a node (new, failed elsewhere, node gone)
    send             log the executions (write-ahead), then one send call per agent
    collect          one call per agent; commit results and failures; ack them next time
    balance          an idle agent takes unstarted jobs from the one expected to end last
    check_timeouts   take jobs back from an agent past its family's timeout
    review_durations trial moves decided; slow jobs get a trial move for their next run
    run_backups      near a cycle's end, backup copies of stragglers (idempotent families)

Each job's whereabouts are in the :class:`~jodl.master.book.JobBook`; the steps are
done by components given the book: :class:`~jodl.master.nodes.Nodes`,
:class:`~jodl.master.dispatch.Dispatcher`, :class:`~jodl.master.outcomes.Outcomes`
and :class:`~jodl.master.balancer.Balancer`.

Every decision is committed to the reconstruction log before it is acted on (sends)
or before it is acknowledged (results), so :meth:`Master.run_cycle` on a new master
resumes an unfinished run: it asks agents which logged executions they still hold
and re-runs only jobs with no committed result.
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from .. import family as family_registry
from ..config import Settings
from ..exceptions import AgentUnavailable, Fenced, UnknownFamily
from ..log.engine import make_engine
from ..log.records import PendingJob
from ..log.store import Store
from ..log.writer import LogWriter
from ..metrics import LOOP_STEP, MasterGauges
from ..placement import Knowledge
from ..registry import serve_hello
from .balancer import Balancer
from .book import JobBook
from .controls import Controls
from .dispatch import Dispatcher
from .families import FamilySettings
from .leadership import Leadership
from .nodes import Nodes, NodeSlot, known_versions
from .outcomes import Outcomes
from .records import ActiveRun, Ledger, RunSummary
from .runs import RunKeeper

log = logging.getLogger("jodl.master")

#: Seconds between two reloads, in a serving master, of the settings and node rules of
#: the families it knows (a cycle's opening reloads its own family at once anyway).
FAMILY_REFRESH = 5.0
#: The cyclic garbage collector's first threshold while a master runs (Python's
#: default: 700). The loop makes and drops several small acyclic objects per job;
#: a collection every 700 of them, each walking the master's large state, took
#: about a third of its time. Restored by :meth:`Master.close`.
GC_THRESHOLD = 50_000


class Feeder:
    """A source of on-demand jobs for :meth:`Master.serve` (e.g. the on-demand queue).

    ``claim`` is called once per loop step from the master's thread and returns
    jobs (with ``run_id`` None and ``claim`` set to their claimed attempt) that
    the master places and runs like jobs of a cycle.
    """

    def claim(self, master: Master, limit: int) -> list[PendingJob]:
        raise NotImplementedError

    def close(self) -> None:
        """Called by :meth:`Master.close`: stop, and give back what was taken but not run."""

    def take_over(self, master: Master) -> None:
        """Called once when ``master`` became leader after another: adopt what that one
        took and did not finish (its unfinished runs are resumed by the master itself)."""


def _family_versions() -> dict[str, str]:
    """Versions of the families installed with this master (checked against agents')."""
    try:
        return known_versions(family_registry.installed())
    except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop the master
        log.warning("could not load the installed families (%s): versions not checked", exc)
        return {}


class Master:
    """Runs cycles of job families on the registered agents."""

    def __init__(
        self,
        settings: Settings | None = None,
        store: Store | None = None,
        name: str | None = None,
        progress: Callable[[int, int], None] | None = None,
        takeover: bool = False,
        family_classes: dict[str, type[family_registry.Family]] | None = None,
    ) -> None:
        """``family_classes``: the family classes whose versions agents must run (default:
        those installed with this master; a family it does not know is not checked)."""
        self.settings = settings or Settings.from_env()
        #: Take the lease even from a live master (which is then fenced): ``--takeover``.
        self.takeover = takeover
        self.store = store or Store(make_engine(self.settings.database_url))
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.leadership = Leadership(self.store, self.name, self.settings.lease_ttl, takeover)
        self.epoch = 0
        self.knowledge = Knowledge()
        self.runs: dict[int, ActiveRun] = {}
        self.feeders: list[Feeder] = []
        self.writer = LogWriter(self.store)
        self.book = JobBook()
        self.ledger = Ledger(self.book, self.writer)
        self.families = FamilySettings(self.store, self.settings.max_attempts)
        if family_classes is not None:
            versions = known_versions(family_classes)
        else:
            versions = _family_versions()
        self.fleet = Nodes(
            self.settings, self.store, self.book, self.ledger, self.families, versions,
            self.knowledge,
        )  # fmt: skip
        self.outcomes = Outcomes(
            self.store, self.book, self.fleet, self.ledger, self.families, self.knowledge, self.runs
        )
        self.outcomes.progress = progress
        self.dispatcher = Dispatcher(
            self.store,
            self.book,
            self.fleet,
            self.families,
            self.knowledge,
            self.outcomes,
            self.runs,
            self.settings.batch_size,
        )
        self.balancer = Balancer(
            self.store,
            self.book,
            self.fleet,
            self.ledger,
            self.outcomes,
            self.families,
            self.knowledge,
            self.runs,
        )
        self.outcomes.watcher = self.balancer
        self.fleet.on_gone = self.balancer.trials.node_gone
        self.gauges = MasterGauges()
        self.keeper = RunKeeper(
            self.store,
            self.book,
            self.fleet,
            self.ledger,
            self.outcomes,
            self.balancer,
            self.families,
            self.knowledge,
            self.runs,
            self.gauges,
        )
        #: `jodl run cancel` and `jodl jobs delete` asked of this master (through the log).
        self.controls = Controls(self.store, self.book, self.outcomes, self.runs)
        self.controls.taker = self.name
        self._requests: queue.SimpleQueue[tuple[str, Future[RunSummary]]] = queue.SimpleQueue()
        self._waiting: dict[int, list[Future[RunSummary]]] = {}
        self._families_read = time.monotonic()
        self._started = False
        self._gc: tuple[int, ...] | None = None
        self._hello: Any = None
        self._idle = 0
        #: Serving starts with resuming the runs the last leader left unfinished.
        self._resume = True

    @property
    def nodes(self) -> dict[int, NodeSlot]:
        """The nodes by id (read only)."""
        return self.fleet.slots

    @property
    def pending(self) -> dict[int, PendingJob]:
        """Every job this master holds, by id (read only: the job book changes them)."""
        return self.book.jobs

    def _set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        parts = (self.ledger, self.outcomes, self.dispatcher, self.balancer, self.keeper)
        for part in (*parts, self.writer):
            part.epoch = epoch

    # -- start ------------------------------------------------------------------------------

    def stand_by(self, stop: threading.Event | None = None) -> bool:
        """Wait as a standby until this master leads (True) or ``stop`` is set (False).

        PostgreSQL only: a SQLite file has one master (:class:`LeaseHeld` at once).
        """
        if self.store.dialect == "sqlite":
            return True  # start() takes the lease or says who holds it
        stop = stop or threading.Event()
        while not stop.is_set():
            if self.leadership.poll():
                return True
            stop.wait(self.leadership.poll_every)
        return False

    def start(self) -> None:
        """Take the master lease (new epoch), load what was learned, connect the agents."""
        if self._started:
            return
        if self.leadership.led:
            self._set_epoch(next(iter(self.leadership.led.values())))
        else:
            self._set_epoch(self.leadership.take())
        self.leadership.keep()  # starts renewing the lease in its own thread
        self.fleet.master_id = self.name
        self.fleet.cluster = self.store.cluster_id()
        self._gc = gc.get_threshold()
        gc.set_threshold(max(GC_THRESHOLD, self._gc[0]), *self._gc[1:])
        self.store.load_knowledge(self.knowledge)
        if self.settings.register_listen and self._hello is None:
            self._hello = serve_hello(self.settings, self.store, self.settings.register_listen)
        self._started = True
        self.fleet.refresh(self.epoch, force=True)

    def close(self) -> None:
        """Commit what is queued, acknowledge it, and disconnect (the log stays resumable)."""
        try:
            self.writer.flush()
            self.controls.settle_closed()
        except Fenced as exc:  # another master leads now: nothing of ours is written
            log.warning("stopped as fenced: %s", exc)
        finally:
            if self._gc is not None:
                gc.set_threshold(*self._gc)
                self._gc = None
            self.writer.close()
            for feeder in self.feeders:  # after the commits: results in hand count
                feeder.close()
            if self._hello is not None:
                self._hello.close()
                self._hello = None
            for slot in self.fleet:
                if slot.acks and slot.usable:
                    try:
                        slot.link.ack(self.epoch, slot.take_acks())
                    except AgentUnavailable:
                        pass
                slot.link.close()
            self.fleet.close()
            self._started = False
            try:  # the next master need not wait for the lease to expire
                self.leadership.release()
            except Exception:  # noqa: BLE001 - the database may be gone; it expires
                log.warning("could not release the master lease; it expires by itself")

    # -- cycles -----------------------------------------------------------------------------

    def run_cycle(self, family_name: str) -> RunSummary:
        """Run (or resume) one cycle of ``family_name`` until every due job is done or dead."""
        self.start()
        family = self.store.family(family_name)
        if family is None:
            raise UnknownFamily(f"no family {family_name!r} in the database (no jobs added)")
        run, resumed = self.store.open_run(family, self.epoch)
        active = self.keeper.open(run, family, resumed)
        while active.remaining > 0:
            self.step()
        summary = self.keeper.finish(active)
        self.controls.settle_closed()  # a cancel of this run is answered now
        return summary

    def request_cycle(self, family_name: str) -> Future[RunSummary]:
        """Ask a serving master (any thread) to run a cycle; the future gets the summary."""
        future: Future[RunSummary] = Future()
        self._requests.put((family_name, future))
        return future

    def serve(self, stop: threading.Event | None = None) -> None:
        """Run until ``stop`` is set: requested cycles, feeders' on-demand jobs, the loop."""
        self.start()
        if self._resume:  # once per leadership: what the last leader left unfinished
            self._resume = False
            for family_name in self.store.running_families():
                self.request_cycle(family_name)  # the last leader's unfinished runs
            for feeder in self.feeders:
                feeder.take_over(self)
        stop = stop or threading.Event()
        while not stop.is_set():
            self._take_requests()
            self.refresh_families()
            self._feed()
            if self.book.jobs or self.runs:
                self.step()
            else:
                self.keep_lease()
                self.controls.poll()
                self.fleet.refresh(self.epoch)
                self.gauges.maybe_update(self)
                time.sleep(self.settings.idle_sleep)
            for active in [a for a in self.runs.values() if a.remaining <= 0]:
                summary = self.keeper.finish(active)
                for future in self._waiting.pop(active.run.id, []):
                    future.set_result(summary)

    def _feed(self) -> None:
        """On-demand jobs the feeders claimed start waiting in the book."""
        room = max(0, 4 * self.settings.batch_size - len(self.book.jobs))
        for feeder in self.feeders:
            for job in feeder.claim(self, room):
                if job.id in self.book.jobs:
                    continue
                if not self.families.known(job.family):
                    family = self.store.family(job.family)
                    if family is None:
                        continue
                    self.families.setup(family)
                self.book.hold(job)

    def refresh_families(self, force: bool = False) -> None:
        """Every FAMILY_REFRESH seconds, read the known families' settings and node rules
        again: an operator's ``jodl family set|allow|deny`` holds for on-demand jobs too."""
        now = time.monotonic()
        if not force and now - self._families_read < FAMILY_REFRESH:
            return
        self._families_read = now
        for name in list(self.families.strategies):
            family = self.store.family(name)
            if family is not None:
                self.families.setup(family, reload=True)

    def _take_requests(self) -> None:
        while True:
            try:
                family_name, future = self._requests.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                family = self.store.family(family_name)
                if family is None:
                    raise UnknownFamily(f"no family {family_name!r} in the database")
                run, resumed = self.store.open_run(family, self.epoch)
                if run.id in self.runs:
                    self._waiting[run.id].append(future)  # already running: share its outcome
                    continue
                self.keeper.open(run, family, resumed)
                self._waiting[run.id] = [future]
            except Exception as exc:  # noqa: BLE001 - handed to the requesting thread
                future.set_exception(exc)

    def cancel(self, job_ids: list[int], reason: str = "job deleted") -> int:
        """Stop dispatching these jobs: drop them unsent, cancel them on agents if sent.

        Returns how many of them this master held.
        """
        return self.outcomes.cancel(job_ids, reason)

    # -- the loop ------------------------------------------------------------------------

    def step(self) -> bool:
        """One pass of the loop; True when something happened (results or sends)."""
        started = time.perf_counter()
        self.writer.check()
        self.keep_lease()
        self.controls.poll()
        self.fleet.refresh(self.epoch)
        self.dispatcher.assign()
        sent = self.dispatcher.send()
        got = self.outcomes.collect()
        self.balancer.balance()
        self.balancer.check_timeouts()
        self.balancer.trials.review_durations()
        self.outcomes.flush_cancels()
        self.balancer.run_backups()
        LOOP_STEP.observe(time.perf_counter() - started)
        self.gauges.maybe_update(self)  # metrics and runs' progress, once a second at most
        if not (sent or got):
            time.sleep(self._idle_pause())
        else:
            self._idle = 0
            if not sent:
                # Results came in but nothing new went out: the agents' queues are full.
                # Polling again at once would make an agent answer a call per result; the
                # next results are still seen within POLL_SHARE of a running job.
                time.sleep(min(self.settings.idle_sleep, self.balancer.poll_cap()))
        return bool(sent or got)

    def _idle_pause(self) -> float:
        self._idle = min(self._idle + 1, 12)
        return min(self.settings.idle_sleep, 0.0005 * 2**self._idle, self.balancer.poll_cap())

    def keep_lease(self) -> None:
        """Renew the master lease every third of its TTL (one small UPDATE); :class:`Fenced`
        when another master took it meanwhile, or when it could not be renewed in time
        (see :class:`~jodl.master.leadership.Leadership`)."""
        self.leadership.keep()


__all__ = ["Feeder", "Master"]
