"""The master: runs cycles of job families on agents, one thread, polling.

:meth:`Master.step` is the loop, one pass, top to bottom (docs/architecture.md#the-master-loop):

    keep_lease       renew the master lease (fenced if another master took it)
    refresh nodes    connect new agents, retry unreachable ones (backoff), drop removed ones
    review coverage  a run whose family no live agent serves says so (its jobs wait)
    assign           place jobs that need a node (new, failed elsewhere, node gone)
    send             log the executions (write-ahead), then one send call per agent
    collect          one call per agent; commit results and failures; ack them next time
                     (before assign and send while a resumed run has sent nothing yet)
    read_more        the next window of a large run's jobs, and a resumed run's trial moves
    balance          an idle agent takes unstarted jobs from the one expected to end last,
                     sent to it at once
    check_timeouts   take jobs back from an agent past its family's timeout
    review_durations trial moves decided; slow jobs get a trial move for their next run
    run_backups      near a cycle's end, backup copies of stragglers (idempotent families)

Each job's whereabouts are in the :class:`~jodl.master.book.JobBook`; the steps are
done by components given the book (:class:`~jodl.master.nodes.Nodes`, ``Dispatcher``,
``Outcomes``, ``Balancer``). Every decision is committed to the reconstruction log
before it is acted on (sends) or acknowledged (results), so :meth:`Master.run_cycle`
on a new master resumes an unfinished run: it asks agents which logged executions
they still hold and re-runs only jobs with no committed result.
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from .. import failpoint
from .. import family as family_registry
from ..agent.registry import serve_hello
from ..exceptions import AgentUnavailable, Fenced, Stopped, UnknownFamily
from ..log.engine import make_engine
from ..log.records import PendingJob
from ..log.store import Store
from ..log.writer import LogWriter
from ..obs import tracing
from ..obs.metrics import LOOP_STEP
from ..placement import Knowledge
from ..settings.config import Settings
from . import sharing
from .asking import ask_leader
from .balancer import Balancer
from .book import JobBook
from .calls import Outcome
from .controls import Controls
from .coverage import Coverage
from .dispatch import Dispatcher
from .families import FamilySettings
from .feeder import Feeder
from .gauges import MasterGauges
from .leadership import Leadership
from .nodes import Nodes, NodeSlot
from .outage import LeaseLapsed, is_outage, lease_lapsed, reason
from .outcomes import Outcomes
from .parts import Parts
from .records import Ledger, RunSummary
from .runs import RunKeeper
from .seen import LastSeen
from .versions import InstalledVersions, Versions, known_versions

log = logging.getLogger("jodl.master")

#: Seconds between two reloads, in a serving master, of the settings and node rules of
#: the families it knows (a cycle's opening reloads its own family at once anyway).
FAMILY_REFRESH = 5.0
#: The cyclic garbage collector's first threshold while a master runs (Python's
#: default: 700). The loop makes and drops several small acyclic objects per job;
#: a collection every 700 of them, each walking the master's large state, took
#: about a third of its time. A step holds tens of thousands of them at once (its
#: rows, jobs and placements): at 50,000, a million-job cycle ran 43 collections in its
#: first cycle and 61 in its second, 1.8 s and 3.1 s of collecting (41 ms each); at
#: 200,000, 6 and 1, 0.6 s and 0.2 s (gc.callbacks, bench/scale.py's cycle). Restored
#: by :meth:`Master.close`.
GC_THRESHOLD = 200_000
#: The interpreter's switch interval while a master runs (Python's default: 5 ms). The
#: loop, the log writer and the calls to agents are threads of one process, and each
#: round trip to the database or an agent ends with its thread waiting for the one that
#: holds the interpreter, up to the interval. The log writer's commit is about ten round
#: trips: with 5 ms, a one-row statement of it took 2–6 ms while the loop placed and
#: collected, a commit of 1,500 results 74 ms, and on-demand jobs went only as fast as
#: the writer (bench/ondemand.py); with 0.5 ms, 1–2 ms and 34 ms. Restored by
#: :meth:`Master.close`.
SWITCH_INTERVAL = 0.0005


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
        tracing.configure(self.settings.traces)
        #: Take the lease even from a live master (which is then fenced): ``--takeover``.
        self.takeover = takeover
        database = store or Store(make_engine(self.settings.database_url))
        #: Every write proves this master's lease epoch (:mod:`jodl.log.fence`): once
        #: another master took over, none is made, whatever step it is in.
        self.store = database.fenced(lambda: self.leadership.epoch)
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.feeders: list[Feeder] = []
        self._progress = progress
        self._family_classes = family_classes
        self._requests: queue.Queue[tuple[str, Future[RunSummary]]] = queue.Queue()
        #: Requests taken when the database stopped answering: taken again first.
        self._again: list[tuple[str, Future[RunSummary]]] = []
        self._waiting: dict[int, list[Future[RunSummary]]] = {}
        self._hello: Any = None
        #: A share of the families (PostgreSQL, :meth:`stand_by`), else everything.
        self.per_family = False
        self.next_lead = 0.0
        #: Called after the serve loop's first step (:meth:`after_first_dispatch`).
        self._deferred: list[Callable[[], None]] = []
        #: Set by a feeder with new jobs (:meth:`wake`): ends the loop's pause at once.
        self._woken = threading.Event()
        self.build()

    def build(self) -> None:
        """The parts that lead: made anew after a database outage (nothing in memory is
        trusted across one; see :mod:`jodl.master.outage`)."""
        takeover, progress, family_classes = self.takeover, self._progress, self._family_classes
        self.leadership = Leadership(self.store, self.name, self.settings.lease_ttl, takeover)
        self.writer = LogWriter(self.store)
        book = JobBook()
        versions: Versions = InstalledVersions()
        if family_classes is not None:
            versions = known_versions(family_classes)
        #: What the parts share: made anew with them, read by each (:mod:`.parts`).
        self.parts = parts = Parts(
            settings=self.settings,
            store=self.store,
            name=self.name,
            leadership=self.leadership,
            book=book,
            ledger=Ledger(book, self.writer),
            families=FamilySettings(self.store, self.settings.max_attempts),
            knowledge=Knowledge(),
            versions=versions,
            gauges=MasterGauges(),
            progress=progress,
        )
        self.book, self.ledger, self.runs = book, parts.ledger, parts.runs
        self.families, self.knowledge, self.gauges = parts.families, parts.knowledge, parts.gauges
        self.fleet = Nodes(parts)
        self.outcomes = Outcomes(parts, self.fleet)
        self.dispatcher = Dispatcher(parts, self.fleet, self.outcomes)
        self.balancer = Balancer(parts, self.fleet, self.outcomes)
        self.keeper = RunKeeper(parts, self.fleet, self.outcomes, self.balancer)
        self.seen = LastSeen(self.store)
        self.coverage = Coverage(parts, self.fleet)
        #: `jodl run cancel` and `jodl jobs delete` asked of this master (through the log).
        self.controls = Controls(parts, self.outcomes)
        self._families_read = time.monotonic()
        self._started = False
        #: The collector's thresholds and the switch interval to restore (:meth:`start`).
        self._interpreter: tuple[tuple[int, ...], float] | None = None
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

    @property
    def epoch(self) -> int:
        """The lease epoch this master's writes and calls carry (0: it leads nothing)."""
        return self.parts.epoch

    def set_epoch(self, epoch: int) -> None:
        """Announce a new epoch: the parts read it from their handle, the log writer
        stamps it on what it commits."""
        self.parts.epoch = self.writer.epoch = epoch
        self.fleet.led = self.leadership.families()

    def requested(self) -> set[str]:
        """Families whose cycle is asked of this master and not opened yet."""
        return {name for name, _ in list(self._requests.queue)}

    def leads(self, family: str) -> bool:
        """Whether this master runs ``family`` now (its share, or everything)."""
        return not self.per_family or self.leadership.leads(family)

    # -- start ------------------------------------------------------------------------------

    def stand_by(self, stop: threading.Event | None = None) -> bool:
        """Wait as a standby until this master leads a share of the families (True)
        or ``stop`` is set (False); from then on :meth:`serve` keeps the share right.

        PostgreSQL only: a SQLite file has one master (:class:`LeaseHeld` at once).
        """
        return sharing.stand_by(self, stop)

    def start(self) -> None:
        """Take the master lease (new epoch), load what was learned, connect the agents."""
        if self._started:
            return
        if not self.leadership.led:
            self.leadership.take()
        self.set_epoch(self.leadership.epoch)
        self.leadership.keep()  # starts renewing the lease in its own thread
        self.fleet.master_id = self.name
        self.fleet.cluster = self.store.cluster_id()
        thresholds, interval = self._interpreter = (gc.get_threshold(), sys.getswitchinterval())
        gc.set_threshold(max(GC_THRESHOLD, thresholds[0]), *thresholds[1:])
        sys.setswitchinterval(min(SWITCH_INTERVAL, interval))
        self.store.load_knowledge(self.knowledge)
        self.listen_for_hellos()
        self._started = True
        self.fleet.refresh(self.epoch, force=True)

    def listen_for_hellos(self) -> None:
        """Agents' hellos (``JODL_REGISTER_LISTEN``) are recorded as nodes from now on."""
        if self.settings.register_listen and self._hello is None:
            self._hello = serve_hello(
                self.settings, self.store.unfenced(), self.settings.register_listen
            )

    def close(self) -> None:
        """Commit what is queued, acknowledge it, and disconnect (the log stays resumable)."""
        self.let_go(final=True)

    def let_go(self, final: bool) -> None:
        """Commit what can be, acknowledge what was committed, disconnect, release the
        lease; ``final``: the feeders and the registration endpoint stop too."""
        try:
            self.writer.flush()
            self.controls.settle_closed()
        except Fenced as exc:  # another master leads now: nothing of ours is written
            log.warning("stopped as fenced: %s", exc)
        except Exception as exc:
            if not is_outage(exc):
                raise
            # Uncommitted results stay unacknowledged on the agents: the next leader
            # collects them again.
            log.warning("stopped: the database does not answer (%s)", reason(exc))
        finally:
            if self._interpreter is not None:
                thresholds, interval = self._interpreter
                gc.set_threshold(*thresholds)
                sys.setswitchinterval(interval)
                self._interpreter = None
            self.writer.close()
            for feeder in self.feeders if final else ():  # after the commits
                feeder.close()
            if final and self._hello is not None:
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
                self.leadership.release(leave=final)
            except Exception:  # noqa: BLE001 - the database may be gone; it expires
                log.warning("could not release the master lease; it expires by itself")

    # -- cycles -----------------------------------------------------------------------------

    def run_cycle(self, family_name: str, stop: threading.Event | None = None) -> RunSummary:
        """Run (or resume) one cycle of ``family_name`` until every due job is done or dead.

        ``stop`` set (SIGTERM) ends it between two steps with :class:`Stopped`; the run
        stays open in the log, and :meth:`close` commits what came in, so the next
        master resumes it.
        """
        while True:
            try:
                summary = self._run_cycle(family_name, stop)
                break
            except Exception as exc:
                if not is_outage(exc):
                    raise
                sharing.rejoin(self, exc, stop)  # then the run is resumed from the log
        try:  # after the run closed: an outage now must not open the next run
            self.controls.settle_closed()  # a cancel of this run is answered now
        except Exception as exc:
            if not is_outage(exc):
                raise
            log.warning("a cancel of this run was not answered: %s", reason(exc))
        return summary

    def _run_cycle(self, family_name: str, stop: threading.Event | None) -> RunSummary:
        self.start()
        family = self.store.family(family_name)
        if family is None:
            raise UnknownFamily(f"no family {family_name!r} in the database (no jobs added)")
        run, resumed = self.store.open_run(family, self.epoch)
        active = self.keeper.open(run, family, resumed)
        while not active.ended:
            if stop is not None and stop.is_set():
                raise Stopped(
                    f"stopped: run {family_name}#{run.number} left unfinished "
                    f"({active.done} of {active.total} done); the next master resumes it"
                )
            self.step()
        return self.keeper.finish(active)

    def request_cycle(self, family_name: str) -> Future[RunSummary]:
        """Ask a serving master (any thread) to run a cycle; the future gets the summary.

        A family another master leads is asked of that one through the log.
        """
        if not self.leads(family_name):
            return ask_leader(self.store, family_name)
        future: Future[RunSummary] = Future()
        self._requests.put((family_name, future))
        return future

    def serve(self, stop: threading.Event | None = None) -> None:
        """Run until ``stop`` is set: requested cycles, feeders' on-demand jobs, the loop.

        ``stop`` is looked at between two steps, so a step is never cut short (SIGTERM
        sets it); :meth:`close` then commits, acknowledges and releases the lease.
        A database outage stops dispatching until the database answers
        (:mod:`jodl.master.outage`); then this master leads again, or stands by. A
        master of a share that finds itself fenced (a write or an agent refused its
        epoch: another master took over) stops at once and stands by, as does one that
        handed every family it led over to other masters.
        """
        stop = stop or threading.Event()
        while not stop.is_set():
            try:
                self._serve(stop)
            except Exception as exc:
                if not (is_outage(exc) or (self.per_family and isinstance(exc, Fenced))):
                    raise
                sharing.rejoin(self, exc, stop)
            else:  # every family handed over, or stopped
                if not stop.is_set():
                    sharing.stand_down(self, stop)

    def after_first_dispatch(self, start: Callable[[], None]) -> None:
        """Call ``start`` in :meth:`serve` after its first step (which sends what the
        resumed runs have ready): applications' services wait, so a restarted master's
        first dispatch is not behind their imports."""
        self._deferred.append(start)

    def _serve(self, stop: threading.Event) -> None:
        self.start()
        if self._resume:  # once per leadership: what the last leader left unfinished
            self._resume = False
            sharing.adopt(self, self.leadership.families())
        while not stop.is_set():
            if self.per_family:
                sharing.lead(self)
                if not self.leadership.led:
                    return  # every family handed over: a standby again (serve())
            self._take_requests()
            self.refresh_families()
            self._feed()
            if self.book.jobs or self.runs:
                self.step()
            else:
                self.keep_lease()
                self.controls.poll()
                self.fleet.refresh(self.epoch)
                self._report()
                self._pause(self.settings.idle_sleep)
            self._start_deferred()
            for active in [a for a in self.runs.values() if a.ended]:
                summary = self.keeper.finish(active)
                failpoint.hit("run_ended")
                for future in self._waiting.pop(active.run.id, []):
                    future.set_result(summary)

    def _start_deferred(self) -> None:
        while self._deferred:
            self._deferred.pop(0)()

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
            if self._again:  # taken before an outage: already running
                family_name, future = self._again.pop()
            else:
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
                # Futures of a run resumed after an outage wait on with the new ones.
                self._waiting.setdefault(run.id, []).append(future)
            except Exception as exc:  # noqa: BLE001 - handed to the requesting thread
                if is_outage(exc):
                    self._again.append((family_name, future))
                    raise
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
        self.coverage.review()
        # A resumed run's first send waits for what the agents finished meanwhile: until
        # collected, those jobs fill the agents' room, so a send before it is empty.
        if self.dispatcher.resuming():
            got = self.outcomes.collect()
            self.dispatcher.assign()
            sent = self.dispatcher.send()
        else:
            self.dispatcher.assign()
            sent, got = self._send_and_collect()
        self.keeper.read_more()  # the next windows of large runs, after the sends
        if self.balancer.balance() and self.balancer.fed:
            # what the thieves took goes out now, not a step later: they are about to idle
            sent += self.dispatcher.send(self.balancer.fed)
        self.balancer.check_timeouts()
        self.balancer.trials.review_durations()
        self.outcomes.flush_cancels()
        self.balancer.run_backups()
        LOOP_STEP.observe(time.perf_counter() - started)
        self._report()  # metrics and runs' progress, once a second at most
        if not (sent or got):
            self._pause(self._idle_pause())
        else:
            self._idle = 0
            if not sent:
                # Results came in but nothing new went out: the agents' queues are full.
                # Polling again at once would make an agent answer a call per result; the
                # next results are still seen within POLL_SHARE of a running job.
                self._pause(min(self.settings.idle_sleep, self.balancer.poll_cap()))
        return bool(sent or got)

    def _send_and_collect(self) -> tuple[int, int]:
        """Send the queued jobs, then collect the agents' outcomes: one round trip per
        agent, an ``exchange`` with each that gets jobs and may have some to give back."""
        asks = self.outcomes.asks()  # before the send: a first batch is sent, not exchanged
        sending = self.dispatcher.prepare()
        wires = sending.wires if sending is not None else {}
        calls: dict[int, Callable[[], Any]] = {}
        for node_id in wires.keys() | asks.keys():
            if node_id not in wires:
                calls[node_id] = self.outcomes.ask(node_id, *asks[node_id])
                continue
            assert sending is not None
            calls[node_id] = (
                sending.with_outcomes(node_id, asks[node_id][0])
                if node_id in asks
                else sending.call(node_id)
            )
        # An exchange's reply splits: what was refused goes with the send, the outcomes
        # are collected; a failed call counts once, with the send.
        delivered: dict[int, Outcome[Any]] = {}
        taken: dict[int, Outcome[Any]] = {}
        for node_id, reply in self.fleet.calls.each(calls).items():
            if node_id in wires and (node_id not in asks or reply.error is not None):
                delivered[node_id] = reply
            elif node_id not in wires:
                taken[node_id] = reply
            else:
                refused, done, failed = reply.get()
                delivered[node_id], taken[node_id] = Outcome(refused), Outcome((done, failed))
        if sending is not None:
            self.dispatcher.deliver(sending, delivered)
        return (sending.total if sending is not None else 0), self.outcomes.take(taken)

    def _report(self) -> None:
        """Gauges and the open runs' progress in the log, at most once a second; the
        nodes' last seen, at most once per :data:`LastSeen.PERIOD`."""
        self.seen.write(self.fleet)
        if self.gauges.due():
            self.gauges.update(
                self.fleet, self.book.flights, self.writer.depth(), self.runs.values()
            )
            self.keeper.record_progress()

    def wake(self) -> None:
        """End the loop's pause now (any thread): a feeder has claimed jobs for it."""
        self._woken.set()

    def _pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or until :meth:`wake`: an on-demand job claimed meanwhile
        is placed at once, not after the rest of a pause of up to ``idle_sleep``."""
        if self._woken.wait(seconds):
            self._woken.clear()

    def _idle_pause(self) -> float:
        self._idle = min(self._idle + 1, 12)
        return min(self.settings.idle_sleep, 0.0005 * 2**self._idle, self.balancer.poll_cap())

    def keep_lease(self) -> None:
        """:class:`Fenced` when another master took a lease or one could not be renewed
        in time (:class:`~jodl.master.leadership.Leadership`); :class:`LeaseLapsed` when
        none was taken (the database did not answer: this master leads again once it
        does)."""
        try:
            self.leadership.keep()
        except Fenced as exc:
            if self.leadership.lost is None and lease_lapsed(self.store, self.epoch):
                raise LeaseLapsed(str(exc)) from None
            raise


__all__ = ["Master"]
