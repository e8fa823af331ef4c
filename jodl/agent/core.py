"""The agent's core: the jobs it holds, its slots and whom it serves (no rpyc here).

The master calls it through :mod:`jodl.agent.server` (or :mod:`jodl.agent.local`).
Results stay until the master acknowledges them after its own commit, so a master
killed at any moment finds them again. Every call is idempotent, keyed by
execution ids: a call that timed out on the master may still arrive.

What the agent remembers is bound to the cluster (the database) and the
connection of the master it serves (README, "Agents that are left alone"):

* ``init`` names the cluster; an agent that served another one forgets its ids,
  results and epoch first, since a new database numbers executions from 1 again.
* ``init`` opens a *session*; every later call carries ``(epoch, session, since)``,
  where ``since`` is the master's time since its previous call. A call of an older
  session (a connection the master gave up) is refused.
* Silent for longer than the detach time, the agent starts nothing queued. The next
  call resumes it if the master was only slow (its ``since`` covers the silence);
  if not (this agent was frozen or cut off while the master gave up on it), the
  call is refused and the session closed. After every ``init`` the agent starts
  nothing until the master's next call, which cancels the executions it gave up
  on: nothing it sent before the gap runs after its result was committed elsewhere.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Iterable
from itertools import islice
from typing import Any

from .. import family as family_registry
from ..config import DETACH_SHARE
from ..exceptions import JodlError, UnknownFamily
from ..family import Family, Permanent
from ..metrics import AGENT_JOBS_FINISHED
from .eventloop import loop_name, new_event_loop
from .known import KnownIds
from .replies import FENCED, KNOWN_ID

log = logging.getLogger("jodl.agent")
_FINISHED_DONE = AGENT_JOBS_FINISHED.labels("done")
_FINISHED_FAILED = AGENT_JOBS_FINISHED.labels("failed")

#: Acknowledged execution ids remembered, so a late duplicate send is not run again.
REMEMBER_ACKED = 200_000
#: Longest error text kept for one failure.
MAX_ERROR = 2000
#: A slot takes several queued jobs at once while jobs take less than this (seconds):
#: for jobs of microseconds the hand-over through the queue cost more than the jobs.
QUICK_JOB = 0.001
#: ... at most this many (and never more than its share of the queue).
QUICK_CHUNK = 32
_RESULT = json.JSONEncoder(separators=(",", ":"), allow_nan=False)

Done = tuple[int, float, float, str]  # exec_id, duration, finished (unix), result JSON
Failed = tuple[int, float, float, str, bool]  # exec_id, duration, finished, error, retryable
#: A family as the agent reports it: name, version, is_async, idempotent.
FamilyRow = tuple[str, str, bool, bool]


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
    ) -> None:
        self.name = name
        self.slots = slots
        self.async_slots = async_slots
        self.speed = speed
        self.epoch = 0
        self.master_id = ""
        #: The cluster (database) whose execution ids this agent holds; "" before any.
        self.cluster = ""
        #: JODL_AGENT_DETACH as set (None: a share of the master's give-up time).
        self.detach_setting = detach
        #: Seconds of silence after which nothing queued starts (None: never).
        self.detach_after: float | None = detach
        #: The master connection (session) whose calls are accepted; grows with each init.
        self._session = 0
        #: Monotonic time of the last accepted call.
        self._heard = time.monotonic()
        #: Nothing queued starts: set by init until the master's next call, and by a
        #: call that arrives after a gap the master did not account for.
        self._paused = False
        self._classes = family_registry.installed() if families is None else families
        self._instances: dict[str, Family] = {}
        self._cond = threading.Condition()
        self._queue: deque[tuple[int, str, str]] = deque()
        self._aqueue: deque[tuple[int, str, str]] = deque()
        self._running: set[int] = set()
        self._done: dict[int, Done] = {}
        self._failed: dict[int, Failed] = {}
        self._cancelled: set[int] = set()
        self._acked: OrderedDict[int, None] = OrderedDict()
        #: Moving mean of the slots' job durations (seconds), for :data:`QUICK_JOB`.
        self._recent = 1.0
        self._closing = False
        self._threads = [
            threading.Thread(target=self._worker, name=f"slot-{i}", daemon=True)
            for i in range(slots)
        ]
        for thread in self._threads:
            thread.start()
        self._loop = new_event_loop(loop)
        self._async_wakeup: asyncio.Event | None = None
        self._async_thread = threading.Thread(target=self._run_loop, name="async", daemon=True)
        self._async_thread.start()

    # -- families -------------------------------------------------------------------

    def family_list(self) -> tuple[FamilyRow, ...]:
        return tuple(
            (name, str(cls.version), cls.is_async(), bool(cls.idempotent))
            for name, cls in sorted(self._classes.items())
        )

    def _family(self, name: str) -> Family:
        inst = self._instances.get(name)
        if inst is None:
            cls = self._classes.get(name)
            if cls is None:
                raise UnknownFamily(f"unknown family {name!r} on agent {self.name}")
            with self._cond:
                inst = self._instances.get(name)
                if inst is None:
                    inst = cls({"speed": self.speed, "node": self.name})
                    self._instances[name] = inst
        return inst

    # -- protocol ---------------------------------------------------------------------

    def check_epoch(self, epoch: int) -> None:
        if epoch < self.epoch:
            raise JodlError(f"{FENCED} {epoch} is older than {self.epoch}")
        self.epoch = epoch

    def init(self, master_id: str, epoch: int, settings_json: str) -> str:
        """Serve a master: bind to its cluster, open a session, pause until its next call.

        The answer lists the executions queued here (not started), so the master can
        cancel those it gave up on with its next call (which resumes the agent).
        """
        try:
            options = json.loads(settings_json or "{}")
        except ValueError:
            options = {}
        if not isinstance(options, dict):
            options = {}
        cluster = str(options.get("cluster") or "")
        give_up = options.get("give_up")
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
            self.check_epoch(epoch)
            self.detach_after = self._detach_time(give_up)
            self.master_id = master_id
            self._session += 1
            self._heard = time.monotonic()
            self._paused = True
            queued = [job[0] for job in self._queue] + [job[0] for job in self._aqueue]
            session = self._session
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
                "session": session,
                "detach": self.detach_after,
                "queued": queued,
            }
        )

    def _detach_time(self, give_up: Any) -> float | None:
        if type(give_up) not in (int, float) or give_up <= 0:
            return self.detach_setting
        if self.detach_setting is None:
            return float(give_up) * DETACH_SHARE
        if self.detach_setting >= give_up:
            raise JodlError(
                f"agent {self.name}: JODL_AGENT_DETACH ({self.detach_setting:g}s) must be "
                f"shorter than the master's JODL_CALL_TIMEOUT ({give_up:g}s)"
            )
        return self.detach_setting

    def _forget_locked(self) -> None:
        """Drop every id of the old cluster; results of jobs still running are discarded."""
        self._cancelled.update(self._running)
        self._queue.clear()
        self._aqueue.clear()
        self._done.clear()
        self._failed.clear()
        self._acked.clear()
        self.epoch = 0

    def hear(self, epoch: int, session: int | None, since: float) -> bool:
        """Accept a call of the master (fencing, session, gap); True: resume after it.

        ``session`` None and ``since`` 0 for a caller that does not send them.
        """
        with self._cond:
            self.check_epoch(epoch)
            if session is not None and session != self._session:
                raise JodlError(f"stale connection: session {session} was replaced; init again")
            now = time.monotonic()
            gap = now - self._heard - since
            if self.detach_after is not None and gap > self.detach_after:
                # Frozen or cut off while the master gave up on this node: it may have
                # run our queued jobs elsewhere. Only a new init (which cancels them) helps.
                self._paused = True
                self._session += 1
                raise JodlError(
                    f"detached: {gap:.1f}s without the master (more than "
                    f"{self.detach_after:g}s); init again"
                )
            silent = self.detach_after is not None and now - self._heard > self.detach_after
            self._heard = now
            if silent and not self._paused:  # the master was only slow: carry on
                self._cond.notify_all()
                self._loop.call_soon_threadsafe(self._wake_async)
            return self._paused

    def resume(self) -> None:
        """Start queued jobs again (after the first call of a new session)."""
        with self._cond:
            self._paused = False
            self._cond.notify_all()
        self._loop.call_soon_threadsafe(self._wake_async)

    def _halted_locked(self) -> bool:
        """Starts nothing: paused, or silent for longer than the detach time."""
        if self._paused:
            return True
        limit = self.detach_after
        return limit is not None and time.monotonic() - self._heard > limit

    def send(self, jobs: Iterable[tuple[int, str, str]]) -> tuple[tuple[int, str], ...]:
        """Queue jobs; return (exec_id, error) for the refused ones.

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
                cls = self._classes.get(fam)
                if cls is None:
                    refused.append((exec_id, f"unknown family {fam!r} on agent {self.name}"))
                    continue
                (async_jobs if cls.is_async() else sync_jobs).append(job)
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
        """(served by a master yet, seconds since its last call, the detach time)."""
        with self._cond:
            return self._session > 0, time.monotonic() - self._heard, self.detach_after

    def take(self, which: str, ack: Iterable[int], limit: int) -> tuple[Any, ...]:
        """Forget acknowledged ids, then return up to ``limit`` held results of ``which``."""
        with self._cond:
            self._ack_locked(ack)
            held = self._done if which == "done" else self._failed
            return tuple(islice(held.values(), limit))

    def ack(self, ids: Iterable[int]) -> int:
        with self._cond:
            return self._ack_locked(ids)

    def _ack_locked(self, ids: Iterable[int]) -> int:
        count = 0
        for exec_id in ids:
            if self._done.pop(exec_id, None) or self._failed.pop(exec_id, None) is not None:
                count += 1
            self._acked[exec_id] = None
        while len(self._acked) > REMEMBER_ACKED:
            self._acked.popitem(last=False)
        return count

    def remaining(self) -> tuple[int, int, int, int]:
        with self._cond:
            return (
                len(self._queue) + len(self._aqueue),
                len(self._running),
                len(self._done),
                len(self._failed),
            )

    def take_back(self, count: int, ids: Iterable[int] = ()) -> tuple[int, ...]:
        """Hand back unstarted jobs: the given ids, or else the last ``count`` queued."""
        wanted = set(ids)
        with self._cond:
            out: list[int] = []
            for queue in (self._queue, self._aqueue):
                if wanted:
                    keep = [job for job in queue if job[0] not in wanted]
                    out.extend(job[0] for job in queue if job[0] in wanted)
                    queue.clear()
                    queue.extend(keep)
                else:
                    while queue and len(out) < count:
                        out.append(queue.pop()[0])
            for exec_id in out:
                self._acked[exec_id] = None  # a late duplicate send must not run it here
            return tuple(out)

    def cancel(self, ids: Iterable[int]) -> tuple[int, ...]:
        """Drop queued jobs and discard the results of running ones."""
        wanted = set(ids)
        taken = set(self.take_back(0, wanted)) if wanted else set()
        with self._cond:
            for exec_id in wanted:
                if exec_id in self._running:
                    self._cancelled.add(exec_id)
                    taken.add(exec_id)
                if self._done.pop(exec_id, None) or self._failed.pop(exec_id, None):
                    taken.add(exec_id)
                self._acked[exec_id] = None
        return tuple(sorted(taken))

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
            self._store(exec_id, time.perf_counter() - started, outcome, error)

    def _store(
        self, exec_id: int, duration: float, outcome: Any, error: BaseException | None
    ) -> None:
        """Hold one outcome (under the lock) for the master to collect."""
        self._running.discard(exec_id)
        if exec_id in self._cancelled:
            self._cancelled.discard(exec_id)
            return
        finished = time.time()
        if error is None:
            try:
                text = _RESULT.encode(outcome)
            except (TypeError, ValueError) as exc:
                error, text = exc, ""
            else:
                self._done[exec_id] = (exec_id, duration, finished, text)
                _FINISHED_DONE.inc()
                return
        _FINISHED_FAILED.inc()
        retryable = not isinstance(error, Permanent | UnknownFamily)
        message = f"{type(error).__name__}: {error}"[:MAX_ERROR]
        self._failed[exec_id] = (exec_id, duration, finished, message, retryable)

    def _worker(self) -> None:
        cond, queue, running = self._cond, self._queue, self._running
        while True:
            with cond:
                while not queue or self._halted_locked():
                    if self._closing:
                        return
                    # A silence is noticed at the next job; resume() and send() notify.
                    cond.wait(self.detach_after if queue else None)
                take = 1
                if self._recent < QUICK_JOB:
                    take = max(1, min(QUICK_CHUNK, len(queue) // max(1, self.slots)))
                jobs = [queue.popleft() for _ in range(take)]
                running.update(job[0] for job in jobs)
            outcomes: list[tuple[int, float, Any, Exception | None]] = []
            for exec_id, fam, payload in jobs:
                started = time.perf_counter()
                try:
                    result = self._family(fam).run(json.loads(payload))
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
                for exec_id, duration, result, error in outcomes:
                    self._store(exec_id, duration, result, error)
                    self._recent = 0.8 * self._recent + 0.2 * duration

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
                    if not self._aqueue or self._halted_locked():
                        sem.release()
                        break
                    exec_id, fam, payload = self._aqueue.popleft()
                    self._running.add(exec_id)
                task = asyncio.ensure_future(self._run_async(exec_id, fam, payload, sem))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

    async def _run_async(
        self, exec_id: int, fam: str, payload: str, sem: asyncio.Semaphore
    ) -> None:
        started = time.perf_counter()
        try:
            result = await self._family(fam).run(json.loads(payload))
        except Exception as exc:  # noqa: BLE001
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
