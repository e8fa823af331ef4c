"""The master: runs cycles of job families on agents, one thread, polling (DESIGN §6).

Each loop step follows the thesis's list, one method per step::

    refresh_nodes    connect new agents, retry unreachable ones (backoff), drop removed ones
    assign           place jobs that need a node (new, failed elsewhere, node gone)
    send             log the executions (write-ahead), then one send call per agent
    collect_done     one call per agent; commit results; acknowledge them on the next call
    collect_failed   one call per agent; retry elsewhere or declare the job dead
    balance          an idle agent takes unstarted jobs from the one expected to end last
    check_timeouts   take jobs back from an agent past its family's timeout
    review_durations trial moves decided; slow jobs get a trial move for their next run
    run_backups      near a cycle's end, backup copies of stragglers (idempotent families)

and when a cycle opens, make_trial_moves (exploration, a share for new nodes). The
balancing steps live in :mod:`jodl.rebalancer`, their decisions in :mod:`jodl.balance`.

Every decision is committed to the reconstruction log before it is acted on (sends)
or before it is acknowledged (results), so :meth:`Master.run_cycle` on a new master
resumes an unfinished run: it asks agents which logged executions they still hold
and re-runs only jobs with no committed result.
"""

from __future__ import annotations

import datetime as dt
import gc
import json
import logging
import os
import queue
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from . import budget, failpoint
from .agent.client import AgentLink
from .agent.local import make_link
from .agent.replies import Refused
from .budget import RunBytes
from .config import Settings
from .exceptions import AgentUnavailable, Fenced, JodlError, UnknownFamily
from .log.engine import make_engine
from .log.lease import LEASE_RENEW
from .log.models import ExecState, Family, NodeState, Run, utcnow
from .log.outcomes import retry_delay
from .log.records import ClaimDone, ClaimFailed, DeadJob, ExecutionRow, PendingJob
from .log.store import Store
from .log.writer import LogWriter
from .metrics import LOOP_STEP, MasterGauges, count_outcomes, count_sent
from .placement import JobInfo, Knowledge, NodeLoad, Placement, strategy
from .rebalancer import Rebalancer, job_info

log = logging.getLogger("jodl.master")

#: Seconds between two reloads of the node table (nodes added or removed meanwhile).
NODE_REFRESH = 1.0
#: Seconds between two reloads, in a serving master, of the settings and node rules of
#: the families it knows (a cycle's opening reloads its own family at once anyway).
FAMILY_REFRESH = 5.0
#: Seconds of expected work kept queued on an agent beyond its running slots.
QUEUE_AHEAD = 0.5
#: Jobs of a node's backlog looked at per send to pass over those of families at their
#: FamilyOnNode cap there: a cap holds back few jobs, and the window bounds the scan of
#: a long backlog that mostly waits for the capped family.
CAP_SCAN = 1024
#: Results fetched from one agent per call at most.
COLLECT_LIMIT = 10_000
#: The cyclic garbage collector's first threshold while a master runs (Python's
#: default: 700). The loop makes and drops several small acyclic objects per job;
#: a collection every 700 of them, each walking the master's large state, took
#: about a third of its time. Restored by :meth:`Master.close`.
GC_THRESHOLD = 50_000


@dataclass
class RunSummary:
    """What a finished cycle did."""

    family: str
    run_id: int
    number: int
    resumed: bool
    total: int
    done: int
    failed: int
    dead: int
    elapsed: float
    makespan: float | None = None
    lower_bound: float | None = None

    @property
    def ratio(self) -> float | None:
        if self.makespan and self.lower_bound:
            return self.makespan / self.lower_bound
        return None

    def line(self) -> str:
        rate = self.done / self.elapsed if self.elapsed > 0 else 0.0
        text = (
            f"run {self.family}#{self.number}{' (resumed)' if self.resumed else ''}: "
            f"{self.done}/{self.total} done, {self.failed} failed attempts, {self.dead} dead, "
            f"{self.elapsed:.2f}s ({rate:.0f} jobs/s)"
        )
        if self.ratio:
            text += f", makespan {self.makespan:.2f}s = {self.ratio:.2f} x LB"
        return text


@dataclass(slots=True)
class Flight:
    """An execution sent to an agent whose outcome is not committed yet."""

    job_id: int
    node_id: int
    attempt: int
    dispatch_id: int
    sent_at: dt.datetime
    run_id: int | None
    backup: bool = False


@dataclass
class NodeSlot:
    """The master's view of one node during the loop."""

    link: AgentLink
    load: NodeLoad
    families: set[str] = field(default_factory=set)
    #: Job ids placed on this node, not sent yet.
    backlog: deque[int] = field(default_factory=deque)
    #: Executions sent to the node and not finished, by execution id.
    inflight: dict[int, Flight] = field(default_factory=dict)
    #: Execution ids whose outcome is committed: acknowledged on the next call.
    #: The log writer adds to it from its thread, hence the lock.
    acks: list[int] = field(default_factory=list)
    ack_lock: threading.Lock = field(default_factory=threading.Lock)
    removed: bool = False
    #: Families the agent runs as coroutines, and how many at once.
    async_families: set[str] = field(default_factory=set)
    async_slots: int = 0
    #: Moving mean of the durations this node reported (seconds); None before any.
    recent_duration: float | None = None
    #: Families whose class on this agent declares itself idempotent (backups allowed).
    idempotent: set[str] = field(default_factory=set)

    def add_acks(self, ids: list[int]) -> None:
        with self.ack_lock:
            self.acks.extend(ids)

    def take_acks(self) -> list[int]:
        with self.ack_lock:
            acks, self.acks = self.acks, []
        return acks

    def observe(self, durations: list[float]) -> None:
        if not durations:
            return
        mean = sum(durations) / len(durations)
        if self.recent_duration is None:
            self.recent_duration = mean
        else:
            self.recent_duration = 0.7 * self.recent_duration + 0.3 * mean

    @property
    def usable(self) -> bool:
        return self.link.connected and not self.removed


@dataclass
class ActiveRun:
    run: Run
    family: Family
    total: int
    resumed: bool
    started: float
    first_send: float | None = None
    last_result: float | None = None
    done: int = 0
    failed: int = 0
    dead: int = 0
    remaining: int = 0


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


class Master(Rebalancer):
    """Runs cycles of job families on the registered agents.

    The balancing steps of the loop come from :class:`jodl.rebalancer.Rebalancer`.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        store: Store | None = None,
        name: str | None = None,
        progress: Callable[[int, int], None] | None = None,
        takeover: bool = False,
    ) -> None:
        self.settings = settings or Settings.from_env()
        #: Take the lease even from a live master (which is then fenced): ``--takeover``.
        self.takeover = takeover
        self._lease_renewed = 0.0
        self.store = store or Store(make_engine(self.settings.database_url))
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.progress = progress
        self.epoch = 0
        self.knowledge = Knowledge()
        self.nodes: dict[int, NodeSlot] = {}
        self.pending: dict[int, PendingJob] = {}
        #: job_id -> (node_id, expected seconds) while placed or in flight.
        self.placed: dict[int, tuple[int, float]] = {}
        self.unassigned: deque[int] = deque()
        self.runs: dict[int, ActiveRun] = {}
        self.strategies: dict[str, Placement] = {}
        self.max_attempts: dict[str, int] = {}
        #: node_id -> {family: most of its jobs in flight there} (FamilyOnNode.max_slots).
        self.caps: dict[int, dict[str, int]] = {}
        #: family -> (strategy, parameters) its placement instance was built from.
        self._built: dict[str, tuple[str, str]] = {}
        self.feeders: list[Feeder] = []
        #: Open dispatches: executions without an outcome, by dispatch id.
        self.dispatch_left: dict[int, int] = {}
        self.closed_dispatches: list[int] = []
        self.writer = LogWriter(self.store)
        self._requests: queue.SimpleQueue[tuple[str, Future[RunSummary]]] = queue.SimpleQueue()
        self._waiting: dict[int, Future[RunSummary]] = {}
        self._last_refresh = 0.0
        self._families_read = time.monotonic()
        self._started = False
        self._gc: tuple[int, ...] | None = None
        self._hello: Any = None
        self.cluster = ""
        self.gauges = MasterGauges()
        #: Runs of families with a bytes budget: what their results fetched so far.
        self.run_bytes: dict[int, RunBytes] = {}
        self._balancing_init()

    # -- start ------------------------------------------------------------------------------

    def start(self) -> None:
        """Take the master lease (new epoch), load what was learned, connect the agents."""
        if self._started:
            return
        self.epoch = self.store.acquire_lease(self.name, force=self.takeover)
        self._lease_renewed = time.monotonic()
        self.cluster = self.store.cluster_id()
        self._gc = gc.get_threshold()
        gc.set_threshold(max(GC_THRESHOLD, self._gc[0]), *self._gc[1:])
        self.store.load_knowledge(self.knowledge)
        if self.settings.register_listen and self._hello is None:
            from .registry import serve_hello

            self._hello = serve_hello(self.settings, self.store, self.settings.register_listen)
        self._started = True
        self.refresh_nodes(force=True)

    def close(self) -> None:
        """Commit what is queued, acknowledge it, and disconnect (the log stays resumable)."""
        try:
            self.writer.flush()
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
            for slot in self.nodes.values():
                if slot.acks and slot.usable:
                    try:
                        slot.link.ack(self.epoch, slot.take_acks())
                    except AgentUnavailable:
                        pass
                slot.link.close()
            if self._started:
                self._started = False
                try:  # the next master need not wait for the lease to expire
                    self.store.release_lease(self.epoch)
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
        active = self.open_run(run, family, resumed)
        while active.remaining > 0:
            self.step()
        return self.finish_run(active)

    def request_cycle(self, family_name: str) -> Future[RunSummary]:
        """Ask a serving master (any thread) to run a cycle; the future gets the summary."""
        future: Future[RunSummary] = Future()
        self._requests.put((family_name, future))
        return future

    def serve(self, stop: threading.Event | None = None) -> None:
        """Run until ``stop`` is set: requested cycles, feeders' on-demand jobs, the loop."""
        self.start()
        stop = stop or threading.Event()
        while not stop.is_set():
            self._take_requests()
            self.refresh_families()
            for feeder in self.feeders:
                for job in feeder.claim(self, self._feed_room()):
                    if job.id not in self.pending:
                        if job.family not in self.strategies:
                            family = self.store.family(job.family)
                            if family is None:
                                continue
                            self._family_setup(family)
                        self.pending[job.id] = job
                        self.unassigned.append(job.id)
            if self.pending or self.runs:
                self.step()
            else:
                self.keep_lease()
                self.refresh_nodes()
                self.gauges.maybe_update(self)
                time.sleep(self.settings.idle_sleep)
            for active in [a for a in self.runs.values() if a.remaining <= 0]:
                summary = self.finish_run(active)
                future = self._waiting.pop(active.run.id, None)
                if future is not None:
                    future.set_result(summary)

    def refresh_families(self, force: bool = False) -> None:
        """Every FAMILY_REFRESH seconds, read the known families' settings and node rules
        again: an operator's ``jodl family set|allow|deny`` holds for on-demand jobs too."""
        now = time.monotonic()
        if not force and now - self._families_read < FAMILY_REFRESH:
            return
        self._families_read = now
        for name in list(self.strategies):
            family = self.store.family(name)
            if family is not None:
                self._family_setup(family, reload=True)

    def _feed_room(self) -> int:
        return max(0, 4 * self.settings.batch_size - len(self.pending))

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
                    self._waiting[run.id] = future  # already running: share its outcome
                    continue
                self.open_run(run, family, resumed)
                self._waiting[run.id] = future
            except Exception as exc:  # noqa: BLE001 - handed to the requesting thread
                future.set_exception(exc)

    def open_run(self, run: Run, family: Family, resumed: bool) -> ActiveRun:
        """Load a run's jobs without a committed result and re-attach logged executions.

        The family's settings and node rules are read again: a change an operator made
        (``jodl family set|allow|deny``) holds from the next cycle on.
        """
        self._family_setup(family, reload=True)
        jobs = self.store.run_jobs(run, family.name)
        done_before = 0
        if resumed:
            done_before, _ = self.store.count_run(run.id)
        active = ActiveRun(
            run,
            family,
            total=len(jobs) + done_before,
            resumed=resumed,
            started=time.perf_counter(),
            done=done_before,
            remaining=len(jobs),
        )
        self.runs[run.id] = active
        for job in jobs:
            self.pending[job.id] = job
        attached = self._reattach(run.id) if resumed else set()
        counter = budget.run_bytes(self.store.engine, family, run.id, resumed)
        if counter is not None:
            self.run_bytes[run.id] = counter
        self.make_trial_moves(active, jobs)
        self.unassigned.extend(job.id for job in jobs if job.id not in attached)
        if counter is not None and counter.stopped:
            self.hold_back(run.id)
        log.info(
            "run %s#%d %s: %d jobs to do",
            family.name,
            run.number,
            "resumed" if resumed else "opened",
            len(jobs),
            extra={"run_id": run.id, "family": family.name},
        )
        return active

    def _family_setup(self, family: Family, reload: bool = False) -> None:
        if reload or family.name not in self.strategies:
            params = self.family_tuning(family)  # balancing knobs out, the strategy's own left
            built = (family.strategy, json.dumps(params, sort_keys=True, default=str))
            if self._built.get(family.name) != built:  # a strategy keeps what it learned
                self.strategies[family.name] = strategy(family.strategy, params)
                self._built[family.name] = built
            self.max_attempts[family.name] = family.max_attempts or self.settings.max_attempts
            for caps in self.caps.values():
                caps.pop(family.name, None)
            for node_id, rule in self.rules[family.name].items():
                if rule.allowed and rule.max_slots:
                    self.caps.setdefault(node_id, {})[family.name] = rule.max_slots

    def _reattach(self, run_id: int | None) -> set[int]:
        """After a restart: keep executions agents still hold, close the others as lost."""
        attached: set[int] = set()
        lost: list[ExecutionRow] = []
        by_node: dict[int, list[Any]] = {}
        for sent in self.store.sent_executions([run_id]):
            by_node.setdefault(sent.node_id, []).append(sent)
        for node_id, sents in by_node.items():
            slot = self.nodes.get(node_id)
            held: set[int] = set()
            if slot is not None and slot.usable:
                try:
                    held = set(slot.link.held(self.epoch, [x.exec_id for x in sents]))
                except AgentUnavailable:
                    self._node_down(slot)
            for sent in sents:
                flight = Flight(
                    sent.job_id, node_id, sent.attempt, sent.dispatch_id, sent.sent_at, sent.run_id
                )
                self.dispatch_left[sent.dispatch_id] = (
                    self.dispatch_left.get(sent.dispatch_id, 0) + 1
                )
                job = self.pending.get(sent.job_id)
                if sent.exec_id in held and job is not None and slot is not None:
                    slot.inflight[sent.exec_id] = flight
                    expected = self._expected(job, slot.load)
                    self.placed[sent.job_id] = (node_id, expected)
                    slot.load.queued_jobs += 1
                    slot.load.queued_work += expected
                    attached.add(sent.job_id)
                else:
                    lost.append(
                        self._outcome(
                            sent.exec_id,
                            flight,
                            ExecState.LOST,
                            error="not held by its agent after a restart",
                        )
                    )
        self._commit(lost)
        return attached

    def finish_run(self, active: ActiveRun) -> RunSummary:
        makespan = None
        if active.first_send is not None and active.last_result is not None:
            makespan = active.last_result - active.first_send
        lower_bound = self._lower_bound(active)
        self._write_homes()
        self.writer.flush()  # every outcome and home of the run committed before it closes
        self._flush_acks()
        self.run_bytes.pop(active.run.id, None)
        run = self.store.finish_run(active.run, makespan, lower_bound)
        self.gauges.run_finished(active)
        del self.runs[active.run.id]
        summary = RunSummary(
            family=active.family.name,
            run_id=run.id,
            number=run.number,
            resumed=active.resumed,
            total=active.total,
            done=run.jobs_done,
            failed=run.jobs_failed,
            dead=run.jobs_dead,
            elapsed=time.perf_counter() - active.started,
            makespan=makespan,
            lower_bound=lower_bound,
        )
        log.info("%s", summary.line(), extra={"run_id": run.id, "family": summary.family})
        return summary

    # -- the loop ------------------------------------------------------------------------

    def step(self) -> bool:
        """One pass of the loop; True when something happened (results or sends)."""
        started = time.perf_counter()
        self.writer.check()
        self.keep_lease()
        self.refresh_nodes()
        self.assign()
        sent = self.send()
        got = self.collect()
        self.balance()
        self.check_timeouts()
        self.review_durations()
        self.run_backups()
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
                time.sleep(min(self.settings.idle_sleep, self.poll_cap()))
        return bool(sent or got)

    _idle = 0

    def _idle_pause(self) -> float:
        self._idle = min(self._idle + 1, 12)
        return min(self.settings.idle_sleep, 0.0005 * 2**self._idle, self.poll_cap())

    def keep_lease(self) -> None:
        """Renew the master lease every :data:`LEASE_RENEW` seconds (one small UPDATE);
        :class:`Fenced` when another master took it (``--takeover``) meanwhile."""
        now = time.monotonic()
        if now - self._lease_renewed < LEASE_RENEW:
            return
        if not self.store.renew_lease(self.name, self.epoch):
            raise Fenced("another master took over this database's lease")
        self._lease_renewed = now

    def refresh_nodes(self, force: bool = False) -> None:
        """Pick up nodes added or removed in the log; reconnect unreachable ones when due."""
        now = time.monotonic()
        if force or now - self._last_refresh >= NODE_REFRESH:
            self._last_refresh = now
            seen = set()
            for node in self.store.nodes(include_removed=True):
                seen.add(node.id)
                slot = self.nodes.get(node.id)
                if node.state == NodeState.REMOVED:
                    if slot is not None and not slot.removed:
                        slot.removed = True
                        self._node_down(slot, gone=True)
                        self.node_gone(node.id)
                    continue
                if slot is None or slot.removed:
                    link = make_link(node.id, node.address, self.settings)
                    load = NodeLoad(
                        node.id,
                        node.address,
                        node.slots,
                        node.speed or 1.0,
                        dict(node.labels or {}),
                    )
                    self.nodes[node.id] = NodeSlot(link, load)
        for slot in self.nodes.values():
            if not slot.removed and slot.link.retry_due():
                self._connect(slot)

    def _connect(self, slot: NodeSlot) -> None:
        try:
            info = slot.link.open(self.name, self.epoch, self._init_settings())
            self._reconcile(slot, info.queued)
        except Fenced:
            raise  # refused for our old epoch: stop, the node is fine
        except AgentUnavailable as exc:
            log.warning(
                "node %s unreachable: %s", slot.link.address, exc, extra={"node": slot.link.address}
            )
            self.store.update_node(
                slot.load.id,
                state=NodeState.UNREACHABLE,
                last_error=slot.link.last_error,
                failures=slot.link.failures,
            )
            return
        families = info.families.values()
        slot.families = {fam.name for fam in families}
        slot.idempotent = {fam.name for fam in families if fam.idempotent}
        slot.async_families = {fam.name for fam in families if fam.is_async}
        slot.async_slots = info.async_slots
        slot.load.slots = info.slots
        self.store.update_node(
            slot.load.id,
            state=NodeState.ACTIVE,
            last_seen=utcnow(),
            last_error=None,
            failures=0,
            slots=slot.load.slots,
            families=info.family_table(),
        )
        log.info(
            "node %s connected (%d slots)",
            slot.link.address,
            slot.load.slots,
            extra={"node": slot.link.address},
        )

    def _init_settings(self) -> str:
        """What ``init`` tells an agent: who we are, our cluster, and when we give up."""
        return json.dumps(
            {"master": self.name, "cluster": self.cluster, "give_up": self.settings.call_timeout}
        )

    def _reconcile(self, slot: NodeSlot, queued: tuple[int, ...]) -> None:
        """Cancel on a (re)connected agent what it queues but the log has settled.

        Those are executions given up on (lost with the node, timed out, taken back)
        and maybe run elsewhere since; the agent starts nothing until this call.
        """
        self.writer.flush()  # outcomes decided in memory are in the log before we ask
        given_up = sorted(self.store.settled(list(queued)))
        slot.link.cancel(self.epoch, given_up)
        if given_up:
            log.warning(
                "node %s still queued %d executions given up on: cancelled there",
                slot.link.address,
                len(given_up),
            )

    def _node_down(self, slot: NodeSlot, gone: bool = False) -> None:
        """The node failed or was removed: its jobs (sent or not) go back to be placed."""
        reason = "node removed" if gone else f"node unreachable: {slot.link.last_error}"
        lost = []
        for exec_id, flight in slot.inflight.items():
            lost.append(self._outcome(exec_id, flight, ExecState.LOST, error=reason))
            if self.other_copy(flight.job_id, exec_id):
                continue  # a copy runs elsewhere (a backup): it carries on
            self._unplace(flight.job_id)
            self.unassigned.append(flight.job_id)
        for job_id in slot.backlog:
            self._unplace(job_id)
            self.unassigned.append(job_id)
        slot.inflight.clear()
        slot.backlog.clear()
        slot.take_acks()
        self._commit(lost)
        if not gone:
            self.store.update_node(
                slot.load.id,
                state=NodeState.UNREACHABLE,
                last_error=slot.link.last_error,
                failures=slot.link.failures,
            )
        slot.link.close()

    def _outcome(
        self,
        exec_id: int,
        flight: Flight,
        state: str,
        *,
        result: str | None = None,
        error: str | None = None,
        duration: float | None = None,
        finished: float | None = None,
    ) -> ExecutionRow:
        """The execution row closing ``flight``; counts its dispatch down."""
        left = self.dispatch_left.get(flight.dispatch_id, 1) - 1
        if left <= 0:
            self.dispatch_left.pop(flight.dispatch_id, None)
            self.closed_dispatches.append(flight.dispatch_id)
        else:
            self.dispatch_left[flight.dispatch_id] = left
        ended = _ts(finished) if finished is not None else utcnow()
        started = (
            _ts(finished - duration) if finished is not None and duration is not None else None
        )
        return ExecutionRow(
            id=exec_id,
            run_id=flight.run_id,
            job_id=flight.job_id,
            node_id=flight.node_id,
            attempt=flight.attempt,
            state=state,
            backup=flight.backup,
            epoch=self.epoch,
            sent_at=flight.sent_at,
            started_at=started,
            finished_at=ended,
            duration=duration,
            result=result,
            error=error,
        )

    def _commit(
        self,
        executions: list[ExecutionRow],
        dead: Any = (),
        claims: Any = (),
        after: Callable[[], None] | None = None,
        settle: bool = False,
    ) -> None:
        """Commit outcome rows (and the dispatches they close) through the log writer."""
        closed, self.closed_dispatches = self.closed_dispatches, []
        self.writer.submit(executions, dead, claims, closed, after, settle=settle)

    def _unplace(self, job_id: int) -> None:
        placed = self.placed.pop(job_id, None)
        if placed is not None:
            node_id, expected = placed
            load = self.nodes[node_id].load
            load.queued_jobs -= 1
            load.queued_work = max(0.0, load.queued_work - expected)

    def _expected(self, job: PendingJob, load: NodeLoad) -> float:
        return self.knowledge.expected(job_info(job), load)

    def assign(self) -> int:
        """Place every job waiting for a node with its family's strategy."""
        if not self.unassigned:
            return 0
        by_family: dict[str, list[JobInfo]] = {}
        while self.unassigned:
            job_id = self.unassigned.popleft()
            job = self.pending.get(job_id)
            if job is not None and job_id not in self.placed:
                by_family.setdefault(job.family, []).append(job_info(job))
        placed = 0
        leftover: list[int] = []
        for fam, infos in by_family.items():
            loads = self.candidates(fam)
            if not loads:
                leftover.extend(i.id for i in infos)
                continue
            infos = self.retry_in_place(infos)  # failed there fewer than K times: once more
            pairs = self.strategies[fam].place(infos, lambda _job, ls=loads: ls, self.knowledge)
            chosen = set()
            for info, load in pairs:
                # place() already counted the job into load.queued_*; remember by how much
                self.placed[info.id] = (load.id, self.knowledge.expected(info, load))
                self.nodes[load.id].backlog.append(info.id)
                chosen.add(info.id)
                placed += 1
            leftover.extend(i.id for i in infos if i.id not in chosen)
        self.unassigned.extend(leftover)
        return placed

    def send(self) -> int:
        """Send placed jobs, up to what keeps each agent busy; log the batches first."""
        batches: dict[int, list[int]] = {}
        total = 0
        for node_id, slot in self.nodes.items():
            if not slot.backlog or not slot.usable:
                continue
            take = min(self._room(slot), len(slot.backlog), self.settings.batch_size)
            if take <= 0:
                continue
            caps = self.caps.get(node_id)
            if caps:
                batch = self._take_capped(slot, take, caps)
            else:
                batch = [slot.backlog.popleft() for _ in range(take)]
            if not batch:
                continue
            batches[node_id] = batch
            total += len(batch)
        if not total:
            return 0
        ids = iter(self.store.next_exec_ids(total))
        sent_at = utcnow()
        dispatches: list[dict[str, Any]] = []
        wires: dict[int, list[tuple[int, str, str]]] = {}
        flights: dict[int, list[tuple[int, Flight]]] = {}
        for node_id, job_ids in batches.items():
            # One dispatch per run per node: a batch may mix runs and on-demand jobs.
            per_run: dict[int | None, list[tuple[int, Flight]]] = {}
            wire = wires[node_id] = []
            for job_id in job_ids:
                job = self.pending[job_id]
                exec_id = next(ids)
                group = per_run.setdefault(job.run_id, [])
                dispatch_id = group[0][0] if group else exec_id
                flight = Flight(job_id, node_id, job.attempts + 1, dispatch_id, sent_at, job.run_id)
                group.append((exec_id, flight))
                wire.append((exec_id, job.family, job.payload))
            for run_id, group in per_run.items():
                dispatches.append(
                    {
                        "id": group[0][0],
                        "run_id": run_id,
                        "node_id": node_id,
                        "epoch": self.epoch,
                        "sent_at": sent_at,
                        "items": json.dumps([[e, f.job_id, f.attempt] for e, f in group]),
                    }
                )
                self.dispatch_left[group[0][0]] = len(group)
            flights[node_id] = [pair for group in per_run.values() for pair in group]
        failpoint.hit("before_send")
        count_sent(wires.values())
        self.store.record_dispatches(dispatches)  # write-ahead: committed before agents see jobs
        failpoint.hit("after_log")
        now = time.perf_counter()
        for node_id, wire in wires.items():
            slot = self.nodes[node_id]
            slot.inflight.update(flights[node_id])
            try:
                refused = slot.link.send(self.epoch, wire)
            except Fenced:
                raise  # a newer master took over: stop
            except AgentUnavailable:
                self._node_down(slot)
                continue
            for _, flight in flights[node_id]:
                active = self.runs.get(flight.run_id) if flight.run_id is not None else None
                if active is not None and active.first_send is None:
                    active.first_send = now
            if refused:
                self._refused(slot, refused)
        failpoint.hit("after_send")
        return total

    def _take_capped(self, slot: NodeSlot, take: int, caps: dict[str, int]) -> list[int]:
        """Up to ``take`` jobs from the backlog, none of a family beyond its cap on the node.

        A job in flight (sent, no outcome) may be running: counting those keeps the
        agent from ever running more than the cap at once. The counts are derived here
        from ``slot.inflight``, its one owner, rather than kept beside it: executions
        leave it by eight transitions (results, losses, steals, timeouts, cancels...).
        """
        busy = dict.fromkeys(caps, 0)
        for flight in slot.inflight.values():
            job = self.pending.get(flight.job_id)
            if job is not None and job.family in busy:
                busy[job.family] += 1
        taken: list[int] = []
        held: deque[int] = deque()
        backlog = slot.backlog
        while backlog and len(taken) < take and len(held) < CAP_SCAN:
            job_id = backlog.popleft()
            job = self.pending.get(job_id)
            family = job.family if job is not None else ""
            if family in busy:
                if busy[family] >= caps[family]:
                    held.append(job_id)
                    continue
                busy[family] += 1
            taken.append(job_id)
        if held:
            held.extend(backlog)
            slot.backlog = held
        return taken

    def _room(self, slot: NodeSlot) -> int:
        """How many more jobs to send now: enough to keep the slots busy for QUEUE_AHEAD.

        Sized by the durations this node actually reported (not by placement's
        guesses), so no-op jobs go in large batches and long jobs stay stealable;
        and by the agent's async slots for families that run on its event loop.
        """
        slots = max(1, slot.load.slots)
        if slot.backlog and slot.async_slots:
            head = self.pending.get(slot.backlog[0])
            if head is not None and head.family in slot.async_families:
                slots = slot.async_slots  # coroutines on the agent's loop, not threads
        if slot.recent_duration is None:
            want = 2 * slots
        else:
            want = max(2 * slots, int(slots * QUEUE_AHEAD / max(1e-6, slot.recent_duration)))
        return min(want, self.settings.batch_size) - len(slot.inflight)

    def _refused(self, slot: NodeSlot, refused: tuple[Refused, ...]) -> None:
        """Jobs the agent would not take (e.g. unknown family there): permanent failures."""
        for exec_id, error in refused:
            log.warning("node %s refused execution %s: %s", slot.link.address, exec_id, error)
        failed = [(r.exec_id, 0.0, time.time(), r.reason, r.known_id) for r in refused]
        self._outcomes(slot, (), tuple(failed))

    def collect(self) -> int:
        """Collect done and failed jobs from every agent (c, d); commit; ack next time."""
        got = 0
        for slot in list(self.nodes.values()):
            if not slot.usable or not (slot.inflight or slot.acks):
                continue
            try:
                # Decoded and checked by the link (a bad reply: AgentUnavailable).
                done = slot.link.done(self.epoch, slot.take_acks(), COLLECT_LIMIT)
                failed = slot.link.failed(self.epoch, (), COLLECT_LIMIT) if slot.inflight else []
            except Fenced:
                raise  # a newer master took over: stop
            except AgentUnavailable:
                self._node_down(slot)
                continue
            got += self._outcomes(slot, done, failed)
        return got

    # The two collect steps share one commit: one transaction per node per step.
    collect_done = collect
    collect_failed = collect

    def _outcomes(self, slot: NodeSlot, done: Any, failed: Any) -> int:
        """Commit what ``slot`` reported; update knowledge, runs and queues."""
        if not done and not failed:
            return 0
        now = time.perf_counter()
        node_id = slot.load.id
        rows: list[ExecutionRow] = []
        durations: list[float] = []
        dead: list[DeadJob] = []
        claims: list[ClaimDone | ClaimFailed] = []
        finished: list[PendingJob] = []
        retry: list[int] = []
        acks: list[int] = []
        record = self.knowledge.record
        settle = False  # a job of a run with no home yet: the log gives it one
        spent = self.run_bytes
        over: list[int] = []  # runs whose bytes budget these results passed
        for exec_id, duration, finished_at, result in done:
            flight = slot.inflight.pop(exec_id, None)
            job = self.pending.get(flight.job_id) if flight is not None else None
            acks.append(exec_id)
            if job is None or flight is None:
                # Committed before a restart, superseded, or given up on (lost): only
                # acknowledged, and said, since the job may have run twice.
                log.info("node %s: result of execution %s not awaited", slot.link.address, exec_id)
                continue
            rows.append(
                self._outcome(
                    exec_id,
                    flight,
                    ExecState.DONE,
                    result=result,
                    duration=duration,
                    finished=finished_at,
                )
            )
            durations.append(duration)
            if job.permanent_node_id is None and job.trial_node_id is None:
                settle = True
            if job.claim is not None:
                claims.append(ClaimDone(job.id, job.claim))
            finished.append(job)
            record(job.id, node_id, job.family, duration)
            self.note_done(slot, job, exec_id, duration, rows)
            if spent and job.run_id in spent and spent[job.run_id].add(result):
                over.append(job.run_id)
        n_done = len(finished)
        for exec_id, duration, finished_at, error, retryable in failed:
            flight = slot.inflight.pop(exec_id, None)
            job = self.pending.get(flight.job_id) if flight is not None else None
            acks.append(exec_id)
            if job is None or flight is None:
                continue
            rows.append(
                self._outcome(
                    exec_id,
                    flight,
                    ExecState.FAILED,
                    error=error,
                    duration=duration,
                    finished=finished_at,
                )
            )
            if self.other_copy(job.id, exec_id):
                continue  # another copy of the job still runs: let it finish
            job.attempts += 1
            if job.claim is not None:
                # On demand: back to the queue after a backoff (or dead there), guarded by
                # the claimed attempt; the failure count lives on disk, not in this master.
                record(job.id, node_id, job.family, None)
                out = not retryable or job.attempts >= self.max_attempts.get(job.family, 1)
                due = None if out else utcnow() + dt.timedelta(seconds=retry_delay(job.attempts))
                claims.append(ClaimFailed(job.id, job.claim, error, due))
                finished.append(job)
                continue
            self.note_failure(job, node_id)
            record(job.id, node_id, job.family, None)
            self._unplace(job.id)
            active = self.runs.get(job.run_id) if job.run_id is not None else None
            if active is not None:
                active.failed += 1
            if not retryable or job.attempts >= self.max_attempts.get(job.family, 1):
                dead.append(DeadJob(job.id, error, job.run_id))
                finished.append(job)
                if active is not None:
                    active.dead += 1
            else:
                retry.append(job.id)
        slot.observe(durations)
        count_outcomes(finished, n_done, dead, retry, claims, self.pending)
        # Acknowledged to the agent on a later call, once the writer has committed.
        self._commit(rows, dead, claims, after=lambda: slot.add_acks(acks), settle=settle)
        dead_ids = {d[0] for d in dead}
        touched: set[int] = set()
        for job in finished:
            self.pending.pop(job.id, None)
            if job.id not in dead_ids:
                self._unplace(job.id)
            active = self.runs.get(job.run_id) if job.run_id is not None else None
            if active is not None:
                active.remaining -= 1
                if job.id not in dead_ids:
                    active.done += 1
                active.last_result = now
                touched.add(active.run.id)
        self.unassigned.extend(retry)
        for run_id in over:
            self.hold_back(run_id)
        for run_id in touched:
            active = self.runs[run_id]
            if self.progress is not None:
                self.progress(active.done + active.dead, active.total)
        return len(rows)

    def cancel(self, job_ids: list[int], reason: str = "job deleted") -> int:
        """Stop dispatching these jobs: drop them unsent, cancel them on agents if sent.

        For jobs deleted (or claimed by another attempt) while this master holds
        them; a result they still report is only acknowledged. Returns how many
        of them this master held.
        """
        ids = {job_id for job_id in job_ids if job_id in self.pending}
        if not ids:
            return 0
        rows: list[ExecutionRow] = []
        for slot in self.nodes.values():
            if any(job_id in ids for job_id in slot.backlog):
                slot.backlog = deque(j for j in slot.backlog if j not in ids)
            execs = [e for e, f in slot.inflight.items() if f.job_id in ids]
            for exec_id in execs:
                flight = slot.inflight.pop(exec_id)
                rows.append(self._outcome(exec_id, flight, ExecState.CANCELLED, error=reason))
            if execs and slot.usable:
                self._cancel(slot, execs)
        for job_id in ids:
            self._unplace(job_id)
            self.copies.pop(job_id, None)
            job = self.pending.pop(job_id)
            active = self.runs.get(job.run_id) if job.run_id is not None else None
            if active is not None:
                active.remaining -= 1
        self._commit(rows)
        return len(ids)

    def hold_back(self, run_id: int) -> int:
        """A run's bytes budget is spent: its jobs not sent yet are not sent in this run.

        They stay due (idle, no result in this run), so the next run has them; the
        run records how many. Jobs in flight finish. Returns how many were held back.
        """
        active = self.runs.get(run_id)
        flying = {f.job_id for slot in self.nodes.values() for f in slot.inflight.values()}
        ids = {j for j, job in self.pending.items() if job.run_id == run_id and j not in flying}
        if active is None or not ids:
            return 0
        for slot in self.nodes.values():
            if any(job_id in ids for job_id in slot.backlog):
                slot.backlog = deque(j for j in slot.backlog if j not in ids)
        self.unassigned = deque(j for j in self.unassigned if j not in ids)
        for job_id in ids:
            self._unplace(job_id)
            self.copies.pop(job_id, None)
            del self.pending[job_id]
        active.remaining -= len(ids)
        active.total -= len(ids)
        budget.record_deferred(self.store.engine, run_id, active.family.name, len(ids))
        log.info(
            "run %s#%d: bytes budget spent, %d jobs wait for the next run",
            active.family.name,
            active.run.number,
            len(ids),
            extra={"run_id": run_id, "family": active.family.name},
        )
        return len(ids)

    def _flush_acks(self) -> None:
        for slot in self.nodes.values():
            if slot.acks and slot.usable:
                try:
                    slot.link.ack(self.epoch, slot.take_acks())
                except AgentUnavailable:
                    self._node_down(slot)


def _ts(unix: float) -> dt.datetime:
    """A naive UTC datetime from a unix time (the log stores naive UTC)."""
    return _EPOCH + dt.timedelta(seconds=unix)


_EPOCH = dt.datetime(1970, 1, 1)


__all__ = ["Master", "RunSummary", "JodlError"]
