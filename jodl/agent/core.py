"""The agent's core: the jobs it holds, its slots and whom it serves (no rpyc here).

The master calls it through :mod:`jodl.agent.server` (or :mod:`jodl.agent.local`).
Results stay until the master acknowledges them after its own commit, so a master
killed at any moment finds them again; each is handed once to a master's session
(:attr:`~jodl.agent.sessions.Session.handed`). Every call is idempotent, keyed by
execution ids: a call that timed out on the master may still arrive.

What the agent remembers is bound to the cluster (the database): ``init`` names it,
and an agent that served another one forgets its ids, results and epochs first, since
a new database numbers executions from 1 again. Whom it serves, and when a job may not
start (its master silent, or paused after an init until that master's next call),
is :mod:`jodl.agent.sessions` (README, "Agents that are left alone").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Iterable
from itertools import chain, filterfalse, islice
from operator import itemgetter
from typing import Any

from .. import family as family_registry
from ..family import Family, current_cancellation
from ..obs import tracing
from ..obs.metrics import AGENT_JOBS_FINISHED
from ..settings.config import DEFAULT_FENCE_HOLD
from .cancel import Cancels
from .codec import JobTrace
from .eventloop import loop_name, new_event_loop
from .held import Done, Failed, held_row
from .installed import FamilyRow, Installed
from .known import KnownIds
from .progress import Report
from .replies import KNOWN_ID
from .sessions import Session, Sessions, check_fence_hold, detach_time

log = logging.getLogger("jodl.agent")
_FINISHED_DONE = AGENT_JOBS_FINISHED.labels("done")
_FINISHED_FAILED = AGENT_JOBS_FINISHED.labels("failed")


def _count(done: int, failed: int) -> None:
    """Jobs finished, into the agent's metric."""
    if done:
        _FINISHED_DONE.inc(done)
    if failed:
        _FINISHED_FAILED.inc(failed)


#: Acknowledged execution ids remembered, so a late duplicate send is not run again.
REMEMBER_ACKED = 200_000
#: A slot takes several queued jobs at once while jobs take less than this (seconds):
#: for jobs of microseconds the hand-over through the queue cost more than the jobs.
QUICK_JOB = 0.001
#: ... at most this many (and never more than its share of the queue).
QUICK_CHUNK = 32
#: A slot looks again whether a session may start the jobs it took before the next one
#: (the first of its take included) once this long passed since it last looked
#: (seconds, monotonic: time the agent was frozen counts). A freeze, or a slow job of
#: a chunk, may have detached the session meanwhile, and its master may have placed
#: them elsewhere. Far below any detach time; a lock every 10 ms at most costs quick
#: jobs nothing.
CHUNK_LOOK = 0.01


#: A held outcome's execution id.
_first = itemgetter(0)


class AgentCore:
    """The agent's state and job slots, independent of rpyc (usable in-process)."""

    def __init__(
        self,
        name: str,
        slots: int = 4,
        async_slots: int = 200,
        speed: float = 1.0,
        loop: str = "auto",
        families: dict[str, type[Family]] | None = None,
        detach: float | None = None,
        fence_hold: float = DEFAULT_FENCE_HOLD,
    ) -> None:
        self.name = name
        self.slots = slots
        self.async_slots = async_slots
        self.speed = speed
        #: The cluster (database) whose execution ids this agent holds; "" before any.
        self.cluster = ""
        #: Where this agent's ops endpoint (health, /metrics) listens, "" when it serves
        #: none; set by whoever serves it (:func:`jodl.ops.server.serve_agent`) and told
        #: to every master in the ``init`` answer, which records it for scrapers.
        self.ops_address = ""
        #: JODL_AGENT_DETACH as set (None: a share of the master's give-up time).
        self.detach_setting = detach
        #: The masters' sessions and the leader of each family (under ``_cond``).
        self.sessions = Sessions()
        self.sessions.detach_after = detach
        self.sessions.fence_hold = fence_hold
        classes = family_registry.installed() if families is None else families
        self.installed = Installed(classes, name, {"speed": speed, "node": name})
        #: The families are this environment's entry points (not given): reloadable.
        self._reloadable = families is None
        self._cond = threading.Condition()
        self._queue: deque[tuple[int, str, str]] = deque()
        self._aqueue: deque[tuple[int, str, str]] = deque()
        self._running: set[int] = set()
        #: slot -> the jobs of the chunk it took, not started when it last looked: listed
        #: by ``init`` like queued ones, so a new master cancels those it gave up on.
        self._chunks: dict[int, list[tuple[int, str, str]]] = {}
        self._done: dict[int, Done] = {}
        self._failed: dict[int, Failed] = {}
        #: execution id -> its family, from its send until it is acknowledged or dropped.
        self._family_of: dict[int, str] = {}
        #: execution id -> its trace context, from its send until it starts; empty while
        #: traces are off (the master sends none to an agent whose init said so).
        self._traces: dict[int, JobTrace] = {}
        self._acked: OrderedDict[int, None] = OrderedDict()
        #: Running jobs that were cancelled; they hear it (jodl.family.cancelled).
        self._cancels = Cancels()
        #: Moving mean of the slots' job durations (seconds), for :data:`QUICK_JOB`.
        self._recent = 1.0
        self._closing = False
        self._threads = [
            threading.Thread(target=self._worker, args=(i,), name=f"slot-{i}", daemon=True)
            for i in range(slots)
        ]
        for thread in self._threads:
            thread.start()
        self._loop = new_event_loop(loop)
        self._async_wakeup: asyncio.Event | None = None
        self._async_thread = threading.Thread(target=self._run_loop, name="async", daemon=True)
        self._async_thread.start()

    def family_list(self) -> tuple[FamilyRow, ...]:
        return self.installed.rows()

    def reload(self, why: str) -> int:
        """Read the installed families again (see :mod:`jodl.agent.installed`); the
        generation of the families served from now on. Queued and running jobs and
        held results are kept. A family that fails to import keeps the old classes."""
        if not self._reloadable:
            return self.installed.generation
        before = {row[0]: row[1] for row in self.installed.rows()}
        try:
            classes = family_registry.reload_installed()
        except Exception as exc:  # noqa: BLE001 - a broken package must not stop the agent
            log.error(
                "agent %s: families not reloaded (%s): %s: %s; still serving %s",
                self.name, why, type(exc).__name__, exc, ", ".join(before) or "none",
            )  # fmt: skip
            return self.installed.generation
        if self.installed.replace(classes):
            now = {row[0]: row[1] for row in self.installed.rows()}
            log.warning(
                "agent %s reloaded its families (%s): %s",
                self.name, why, _changes(before, now),
            )  # fmt: skip
        else:
            log.info("agent %s reloaded its families (%s): no change", self.name, why)
        return self.installed.generation

    # -- protocol ---------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The newest epoch a master served this agent at."""
        return self.sessions.top

    @property
    def detach_after(self) -> float | None:
        """Seconds of silence after which a session's jobs start nothing (None: never)."""
        return self.sessions.detach_after

    def init(self, master_id: str, epoch: int, settings_json: str) -> str:
        """Serve a master: bind to its cluster, open a session for the families it leads
        (``families`` in the settings; every family when absent), pause them until its
        next call.

        The answer lists the executions of those families queued here (not started),
        so the master can cancel those it gave up on with its next call (which
        resumes them).
        """
        try:
            options = json.loads(settings_json or "{}")
        except ValueError:
            options = {}
        if not isinstance(options, dict):
            options = {}
        cluster = str(options.get("cluster") or "")
        give_up = options.get("give_up")
        led = options.get("families")
        if isinstance(led, list) and all(type(f) is str for f in led):
            families: Iterable[str] = led
        else:
            families = self.installed.classes
        with self._cond:
            if cluster and self.cluster and cluster != self.cluster:
                log.warning(
                    "agent %s: a master of another cluster (%s, was %s): forgetting what "
                    "the old one sent",
                    self.name,
                    cluster,
                    self.cluster,
                )
                self._forget_locked()
            if cluster:
                self.cluster = cluster
            detach = detach_time(self.detach_setting, give_up, self.name)
            check_fence_hold(self.sessions.fence_hold, options.get("lease_ttl"), give_up, self.name)
            opened = self.sessions.open(master_id, epoch, families)
            self.sessions.detach_after = detach
            owns = self.sessions.owns
            waiting = chain(self._queues(), *self._chunks.values())
            queued = [job[0] for job in waiting if owns(opened, job[1])]
        return json.dumps(
            {
                "name": self.name,
                "slots": self.slots,
                "async_slots": self.async_slots,
                "event_loop": loop_name(self._loop),
                "speed": self.speed,
                "epoch": self.epoch,
                "families": {
                    n: {"version": v, "async": a, "idempotent": i}
                    for n, v, a, i in self.family_list()
                },
                "session": opened.number,
                "detach": self.detach_after,
                "queued": queued,
                "generation": self.installed.generation,
                "ops": self.ops_address,
                "traces": tracing.state.on,
            }
        )

    def _forget_locked(self) -> None:
        """Drop every id of the old cluster; results of jobs still running are discarded."""
        for exec_id in self._running:
            self._cancels.cancel(exec_id)
        self._queue.clear()
        self._aqueue.clear()
        self._chunks.clear()
        self._done.clear()
        self._failed.clear()
        self._acked.clear()
        self._family_of.clear()
        self._traces.clear()
        self.sessions.clear()

    def hear(self, epoch: int, session: int | None, since: float) -> tuple[Session | None, bool]:
        """Accept a call of a master (fencing, session, gap): its session, and whether
        to resume that session's families after the call.

        ``session`` None and ``since`` 0 for a caller that does not send them (it is
        only fenced by the newest epoch, and its calls are not scoped to families).
        """
        with self._cond:
            current, woke = self.sessions.hear(epoch, session, since)
            if woke:  # the master was only slow: carry on
                self._cond.notify_all()
                self._loop.call_soon_threadsafe(self._wake_async)
            return current, current is not None and current.paused

    def resume(self, session: Session | None = None) -> None:
        """Start the session's queued jobs (after the first call of a new session);
        no session: every session's."""
        with self._cond:
            for paused in (session,) if session is not None else self.sessions.by_number.values():
                paused.paused = False
            self._cond.notify_all()
        self._loop.call_soon_threadsafe(self._wake_async)

    def send(
        self,
        jobs: Iterable[tuple[int, str, str]],
        session: Session | None = None,
        traces: dict[int, JobTrace] | None = None,
    ) -> tuple[tuple[int, str], ...]:
        """Queue jobs; return (exec_id, error) for the refused ones. ``traces``: the
        trace contexts of some of them (:mod:`jodl.obs.tracing`), kept until they start.

        An id queued, running or held here is a repeated send and ignored; one that
        finished here (acknowledged, taken back, cancelled) is refused, never dropped.
        """
        refused: list[tuple[int, str]] = []
        sync_jobs: list[tuple[int, str, str]] = []
        async_jobs: list[tuple[int, str, str]] = []
        with self._cond:
            known = self._known_locked()
            batch: set[int] = set()  # the same id twice in one batch runs once too
            for job in jobs:
                exec_id, fam = job[0], job[1]
                if exec_id in batch:
                    continue
                if exec_id in known:
                    if exec_id in self._acked:
                        # Finished, taken back or cancelled here: ignored, the master would
                        # wait for it forever. Said, so it records it and runs the job anew.
                        refused.append((exec_id, f"{KNOWN_ID} {self.name}: {exec_id}"))
                    continue  # queued, running or held: a repeated send of the same one
                batch.add(exec_id)
                cls = self.installed.classes.get(fam)
                if cls is None:
                    refused.append((exec_id, f"unknown family {fam!r} on agent {self.name}"))
                    continue
                if session is not None:  # a family nobody leads yet: this session's
                    self.sessions.owner.setdefault(fam, session.number)
                self._family_of[exec_id] = fam
                (async_jobs if cls.is_async() else sync_jobs).append(job)
            if traces and tracing.state.on:  # kept until each starts (or is dropped)
                for job in chain(sync_jobs, async_jobs):
                    if job[0] in traces:
                        self._traces[job[0]] = traces[job[0]]
            self._queue.extend(sync_jobs)
            self._aqueue.extend(async_jobs)
            if sync_jobs:
                self._cond.notify(min(len(sync_jobs), self.slots))
        if async_jobs:
            self._loop.call_soon_threadsafe(self._wake_async)
        return tuple(refused)

    def _known_locked(self) -> KnownIds:
        return KnownIds(self._running, self._done, self._failed, self._acked, self._queues)

    def _queues(self) -> Iterable[tuple[int, str, str]]:
        yield from self._queue
        yield from self._aqueue

    def silence(self) -> tuple[bool, float, float | None]:
        """(served by a master yet, seconds since any master's last call, the detach time)."""
        with self._cond:
            sessions = self.sessions
            return sessions.opened > 0, time.monotonic() - sessions.last_heard, self.detach_after

    def take(
        self,
        which: str,
        ack: Iterable[int],
        limit: int,
        session: Session | None = None,
        handed: set[int] | None = None,
    ) -> tuple[Any, ...]:
        """Forget acknowledged ids, then return up to ``limit`` held results of ``which``
        (of the families ``session`` leads). ``handed``: ids not to return (the session's
        :attr:`~.sessions.Session.handed`), to which those returned are added."""
        with self._cond:
            self._ack_locked(ack)
            held = self._done if which == "done" else self._failed
            # In C over the held ids in order (oldest first): not those handed already.
            ids: Iterable[int] = held if handed is None else filterfalse(handed.__contains__, held)
            if not self.sessions.sole(session):
                ids = filter(self._mine(session), ids)
            rows = tuple(islice(map(held.__getitem__, ids), limit))
            if handed is not None:
                handed.update(map(_first, rows))
            return rows

    def exchange(
        self,
        jobs: Iterable[tuple[int, str, str]],
        ack: Iterable[int],
        limit: int,
        session: Session | None = None,
        traces: dict[int, JobTrace] | None = None,
        handed: set[int] | None = None,
    ) -> tuple[tuple[tuple[int, str], ...], tuple[Any, ...], tuple[Any, ...]]:
        """:meth:`send`, then :meth:`take_outcomes`: (refused, results, failures)."""
        refused = self.send(jobs, session, traces)
        return (refused, *self.take_outcomes(ack, limit, session, handed))

    def take_outcomes(
        self,
        ack: Iterable[int],
        limit: int,
        session: Session | None = None,
        handed: set[int] | None = None,
    ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """:meth:`take` of the results, then of the failures, in one go (one lock, one
        call): up to ``limit`` of each."""
        with self._cond:
            return (
                self.take("done", ack, limit, session, handed),
                self.take("failed", (), limit, session, handed),
            )

    def _mine(self, session: Session | None) -> Any:
        """A test of an execution id: does ``session`` lead its family now."""
        owns, family_of = self.sessions.owns, self._family_of
        return lambda exec_id: owns(session, family_of.get(exec_id))

    def ack(self, ids: Iterable[int]) -> int:
        with self._cond:
            return self._ack_locked(ids)

    def _ack_locked(self, ids: Iterable[int]) -> int:
        ids = tuple(ids)
        if ids:
            for session in self.sessions.by_number.values():
                session.handed.difference_update(ids)
        count = 0
        for exec_id in ids:
            if self._done.pop(exec_id, None) or self._failed.pop(exec_id, None) is not None:
                count += 1
                self._family_of.pop(exec_id, None)
                self._traces.pop(exec_id, None)
            self._acked[exec_id] = None
        while len(self._acked) > REMEMBER_ACKED:
            self._acked.popitem(last=False)
        return count

    def progress(self) -> tuple[Report, ...]:
        """The newest progress report of each running job that made one."""
        return self._cancels.board.reports()

    def remaining(self) -> tuple[int, int, int, int]:
        with self._cond:
            return (
                len(self._queue) + len(self._aqueue),
                len(self._running),
                len(self._done),
                len(self._failed),
            )

    def take_back(
        self, count: int, ids: Iterable[int] = (), session: Session | None = None
    ) -> tuple[int, ...]:
        """Hand back unstarted jobs (of the families ``session`` leads): the given ids,
        or else the last ``count`` queued."""
        wanted = set(ids)
        with self._cond:
            sole = self.sessions.sole(session)
            if not sole:
                mine = self._mine(session)
                wanted = {exec_id for exec_id in wanted if mine(exec_id)}
            out: list[int] = []
            for queue in (self._queue, self._aqueue):
                if wanted:
                    keep = [job for job in queue if job[0] not in wanted]
                    out.extend(job[0] for job in queue if job[0] in wanted)
                    queue.clear()
                    queue.extend(keep)
                elif sole:
                    while queue and len(out) < count:
                        out.append(queue.pop()[0])
                elif count > len(out):
                    ours = [job for job in queue if mine(job[0])][len(out) - count :]
                    chosen = {job[0] for job in ours}
                    out.extend(job[0] for job in reversed(ours))
                    kept = [job for job in queue if job[0] not in chosen]
                    queue.clear()
                    queue.extend(kept)
            for exec_id in out:
                self._acked[exec_id] = None  # a late duplicate send must not run it here
                self._family_of.pop(exec_id, None)
                self._traces.pop(exec_id, None)
            return tuple(out)

    def cancel(self, ids: Iterable[int], session: Session | None = None) -> tuple[int, ...]:
        """Drop queued jobs and discard the results of running ones (of the families
        ``session`` leads; ids this agent never had are only remembered as finished)."""
        wanted = set(ids)
        taken = set(self.take_back(0, wanted, session)) if wanted else set()
        with self._cond:
            mine = self._mine(session)
            for exec_id in wanted:
                if exec_id in self._family_of and not mine(exec_id):
                    continue  # another master's family now: not ours to cancel
                if exec_id in self._running:
                    self._cancels.cancel(exec_id)  # it stops early if it looks
                    taken.add(exec_id)
                if self._done.pop(exec_id, None) or self._failed.pop(exec_id, None):
                    taken.add(exec_id)
                    self._family_of.pop(exec_id, None)
                    self._traces.pop(exec_id, None)
                self._acked[exec_id] = None
        return tuple(sorted(taken))

    def leaders(self) -> tuple[tuple[str, int, str], ...]:
        """(family, epoch, master) of each family this agent was sent, as it sees them."""
        with self._cond:
            return self.sessions.leaders()

    def held(self, ids: Iterable[int]) -> tuple[int, ...]:
        """Which of ``ids`` this agent still queues, runs or holds a result for."""
        with self._cond:
            known = self._known_locked()
            return tuple(i for i in ids if i in known and i not in self._acked)

    # -- running ------------------------------------------------------------------------

    def _finish(
        self, exec_id: int, started: float, outcome: Any, error: BaseException | None
    ) -> None:
        with self._cond:
            kept = self._store(exec_id, time.perf_counter() - started, outcome, error)
        if kept is not None:
            _count(int(kept), int(not kept))

    def _store(
        self, exec_id: int, duration: float, outcome: Any, error: BaseException | None
    ) -> bool | None:
        """Hold one outcome (under the lock) for the master to collect: True for a
        result, False for a failure, None when discarded (cancelled while it ran).
        The caller counts it (:func:`_count`)."""
        self._running.discard(exec_id)
        self._cancels.board.forget(exec_id)
        if self._cancels.finished(exec_id):
            self._family_of.pop(exec_id, None)
            self._traces.pop(exec_id, None)
            return None  # cancelled while it ran: discarded
        held = held_row(exec_id, duration, outcome, error)
        if held.done is not None:
            self._done[exec_id] = held.done
            return True
        assert held.failed is not None
        self._failed[exec_id] = held.failed
        return False

    def _worker(self, slot: int) -> None:
        cond, queue, running = self._cond, self._queue, self._running
        heard = self._cancels.of(0)  # this slot's, pointed at each job it runs
        current_cancellation.set(heard)
        while True:
            with cond:
                while (first := self.sessions.startable(queue)) is None:
                    if self._closing:
                        return
                    # A silence is noticed at the next job; resume() and send() notify.
                    cond.wait(self.detach_after if queue else None)
                if first:  # jobs of a stopped session ahead: this one alone
                    jobs = [queue[first]]
                    del queue[first]
                else:
                    take = 1
                    if self._recent < QUICK_JOB:
                        take = max(1, min(QUICK_CHUNK, len(queue) // max(1, self.slots)))
                    family = queue[0][1]
                    jobs = [queue.popleft()]
                    while len(jobs) < take and queue and queue[0][1] == family:
                        jobs.append(queue.popleft())
                    if len(jobs) > 1:
                        self._chunks[slot] = jobs[1:]
                running.update(job[0] for job in jobs)
                looked, index = time.monotonic(), 0  # the take's check, under the lock
            outcomes: list[tuple[int, float, Any, Exception | None]] = []
            while index < len(jobs):
                # Checked again before any job, the first included, once CHUNK_LOOK
                # passed since the last check: an agent frozen between its take and
                # the job's start does not start it on thawing if its session halted.
                if time.monotonic() - looked > CHUNK_LOOK:
                    if not self._chunk_goes_on(slot, jobs, index, outcomes):
                        break
                    looked = time.monotonic()
                exec_id, fam, payload = jobs[index]
                index += 1
                started = time.perf_counter()
                heard.exec_id = exec_id
                try:
                    carried = self._traces.pop(exec_id, None) if self._traces else None
                    if carried is None:
                        result = self._run_sync(fam, payload)
                    else:
                        result = self._run_traced(exec_id, fam, payload, carried)
                except Exception as exc:  # noqa: BLE001 - every failure is reported to the master
                    log.debug(
                        "job %s failed: %s",
                        exec_id,
                        traceback.format_exc(),
                        extra={"job": exec_id, "family": fam, "node": self.name},
                    )
                    outcomes.append((exec_id, time.perf_counter() - started, None, exc))
                else:
                    outcomes.append((exec_id, time.perf_counter() - started, result, None))
            with cond:
                self._chunks.pop(slot, None)
                self._keep_locked(outcomes)

    def _keep_locked(self, outcomes: list[tuple[int, float, Any, Exception | None]]) -> None:
        """Hold a slot's outcomes for the master (under the lock) and forget them there."""
        done = failed = 0
        for exec_id, duration, result, error in outcomes:
            kept = self._store(exec_id, duration, result, error)
            if kept is not None:
                done += kept
                failed += not kept
            self._recent = 0.8 * self._recent + 0.2 * duration
        outcomes.clear()
        _count(done, failed)  # once per chunk: an increment took 1.3 µs, once a no-op job

    def _run_sync(self, fam: str, payload: str) -> Any:
        family_ = self.installed.instance(fam)
        parsed = json.loads(payload)
        if family_.payload_model is not None:
            parsed = family_.parse_payload(parsed)
        return family_.run(parsed)

    def _run_traced(self, exec_id: int, fam: str, payload: str, carried: JobTrace) -> Any:
        """:meth:`_run_sync` inside its ``jodl.run`` span (:func:`jodl.obs.tracing.run_span`)."""
        with tracing.run_span(carried.traceparent, self._run_attributes(exec_id, fam, carried)):
            return self._run_sync(fam, payload)

    def _run_attributes(self, exec_id: int, fam: str, carried: JobTrace) -> dict[str, Any]:
        return {
            "jodl.family": fam,
            "jodl.key": carried.key,
            "jodl.exec_id": exec_id,
            "jodl.node": self.name,
            "jodl.attempt": carried.attempt,
        }

    def _chunk_goes_on(
        self,
        slot: int,
        jobs: list[tuple[int, str, str]],
        index: int,
        outcomes: list[tuple[int, float, Any, Exception | None]],
    ) -> bool:
        """Whether ``slot`` may go on with the chunk it took, from ``jobs[index]``: the
        check every take from the queue makes, made again for the rest of a chunk. If
        their session halted meanwhile (detached, or paused by a new master's init), the
        rest goes back to the head of the queue, where the new master's first call
        cancels what it gave up on; ones cancelled meanwhile are dropped either way.

        The ``outcomes`` of the chunk so far are held for the master now: a chunk taken
        while jobs were quick may meet slower ones, whose results would otherwise wait
        for its end (the master sees a node run dry late, and refills it late).
        """
        with self._cond:
            self._keep_locked(outcomes)
            rest = []
            for job in jobs[index:]:
                if self._cancels.finished(job[0]):  # cancelled while it waited in the chunk
                    self._running.discard(job[0])
                    self._family_of.pop(job[0], None)
                    self._traces.pop(job[0], None)
                else:
                    rest.append(job)
            jobs[index:] = rest  # what the slot goes on with, if it does
            if rest and not self.sessions.halted(rest[0][1], time.monotonic()):
                self._chunks[slot] = rest[1:]
                return True
            self._chunks.pop(slot, None)
            self._running.difference_update(job[0] for job in rest)
            self._queue.extendleft(reversed(rest))
            if rest:
                self._cond.notify()  # another slot may run them if another session leads
            return False

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._async_wakeup = asyncio.Event()
        self._loop.run_until_complete(self._async_dispatcher())

    def _wake_async(self) -> None:
        if self._async_wakeup is not None:
            self._async_wakeup.set()

    async def _async_dispatcher(self) -> None:
        assert self._async_wakeup is not None
        sem = asyncio.Semaphore(self.async_slots)
        tasks: set[asyncio.Task[None]] = set()
        while not self._closing:
            await self._async_wakeup.wait()
            self._async_wakeup.clear()
            while True:
                await sem.acquire()
                with self._cond:
                    first = self.sessions.startable(self._aqueue)
                    if first is None:
                        sem.release()
                        break
                    exec_id, fam, payload = self._aqueue[first]
                    del self._aqueue[first]
                    self._running.add(exec_id)
                task = asyncio.ensure_future(self._run_async(exec_id, fam, payload, sem))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

    async def _run_async(
        self, exec_id: int, fam: str, payload: str, sem: asyncio.Semaphore
    ) -> None:
        started = time.perf_counter()
        current_cancellation.set(self._cancels.of(exec_id))  # in this task's own context
        self._cancels.track(exec_id, asyncio.current_task())  # type: ignore[arg-type]
        carried = self._traces.pop(exec_id, None) if self._traces else None
        traced = (
            tracing.run_span(carried.traceparent, self._run_attributes(exec_id, fam, carried))
            if carried is not None
            else contextlib.nullcontext()
        )
        try:
            with traced:
                family_ = self.installed.instance(fam)
                parsed = json.loads(payload)
                if family_.payload_model is not None:
                    parsed = family_.parse_payload(parsed)
                result = await family_.run(parsed)
        except (Exception, asyncio.CancelledError) as exc:  # noqa: BLE001 - cancelled: discarded
            self._finish(exec_id, started, None, exc)
        else:
            self._finish(exec_id, started, result, None)
        finally:
            sem.release()

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._loop.call_soon_threadsafe(self._wake_async)


def _changes(before: dict[str, str], now: dict[str, str]) -> str:
    """What a reload changed, in words (families by name -> version)."""
    parts = [f"+{n} {now[n]}" for n in sorted(set(now) - set(before))]
    parts += [f"-{n}" for n in sorted(set(before) - set(now))]
    parts += [f"{n} {before[n]}->{now[n]}" for n in sorted(now) if before.get(n, now[n]) != now[n]]
    return ", ".join(parts) or "the same names and versions, new code"
