"""The agent: an rpyc server that runs jobs of installed families in bounded slots.

The master calls it (DESIGN §5); it never calls the master except for a one-shot
hello. Results stay here until the master acknowledges them after its own commit,
so a master killed at any moment finds them again. Every call is idempotent,
keyed by execution ids: a call that timed out on the master may still arrive.

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
import socket
import threading
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any

import rpyc
from rpyc.utils.server import ThreadedServer

from . import family as family_registry
from .config import DETACH_SHARE, Settings
from .exceptions import JodlError, UnknownFamily
from .family import Family, Permanent
from .metrics import AGENT_JOBS_FINISHED
from .protocol import (
    STRICT_CONFIG,
    GuardedServer,
    decode_ids,
    decode_jobs,
    encode_done,
    encode_failed,
    require_auth,
    split_address,
)

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
#: How a refusal of an execution id the agent already knows begins (the master
#: retries such a job elsewhere instead of declaring it dead).
KNOWN_ID = "execution id already known on agent"

Done = tuple[int, float, float, str]  # exec_id, duration, finished (unix), result JSON
Failed = tuple[int, float, float, str, bool]  # exec_id, duration, finished, error, retryable


def new_event_loop(kind: str = "auto") -> asyncio.AbstractEventLoop:
    """A new event loop: ``uvloop``, ``asyncio``, or ``auto`` (uvloop when installed).

    uvloop runs its I/O and callbacks in C; ``bench/pagecheck.py --agent-loop
    asyncio`` compares the two (measured: 0.26–0.30 ms of agent CPU per page on
    uvloop, 0.28–0.30 ms on asyncio's own loop).
    """
    if kind != "asyncio":
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise JodlError("JODL_AGENT_LOOP=uvloop, but uvloop is not installed") from None
        else:
            return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


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

    def family_list(self) -> tuple[tuple[str, str, bool], ...]:
        return tuple(
            (name, str(cls.version), cls.is_async()) for name, cls in sorted(self._classes.items())
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
            raise JodlError(f"fenced: epoch {epoch} is older than {self.epoch}")
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
                    n: {"version": v, "async": a, "idempotent": self._classes[n].idempotent}
                    for n, v, a in self.family_list()
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

    def _known_locked(self) -> _Known:
        return _Known(self)

    def take(self, which: str, ack: Iterable[int], limit: int) -> tuple[Any, ...]:
        """Forget acknowledged ids, then return up to ``limit`` held results of ``which``."""
        with self._cond:
            self._ack_locked(ack)
            held = self._done if which == "done" else self._failed
            if len(held) <= limit:
                return tuple(held.values())
            out = []
            for value in held.values():
                out.append(value)
                if len(out) >= limit:
                    break
            return tuple(out)

    def ack(self, ids: Iterable[int]) -> int:
        with self._cond:
            return self._ack_locked(ids)

    def _ack_locked(self, ids: Iterable[int]) -> int:
        count = 0
        for exec_id in ids:
            if self._done.pop(exec_id, None) is not None or self._failed.pop(exec_id, None):
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
            outcomes = []
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


class _Known:
    """Membership test over every id the agent queues, runs, holds or acknowledged."""

    def __init__(self, core: AgentCore) -> None:
        self.core = core
        self._queued: set[int] | None = None

    def __contains__(self, exec_id: int) -> bool:
        core = self.core
        if exec_id in core._running or exec_id in core._done or exec_id in core._failed:
            return True
        if exec_id in core._acked:
            return True
        if self._queued is None:
            self._queued = {j[0] for j in core._queue} | {j[0] for j in core._aqueue}
        return exec_id in self._queued


# Arguments are checked by exact type, never converted: int() or str() of a netref
# would call back into the peer's objects, which is what the strict protocol forbids.


def _int(value: Any, what: str = "value") -> int:
    if type(value) is not int:
        raise TypeError(f"{what} must be a plain int")
    return value


def _str(value: Any, what: str = "value") -> str:
    if type(value) is not str:
        raise TypeError(f"{what} must be a plain str")
    return value


def _ids(values: Any) -> tuple[int, ...]:
    if type(values) is str:
        return decode_ids(values)
    if type(values) is not tuple or any(type(v) is not int for v in values):
        raise TypeError("ids must be a plain tuple of ints")
    return values


def _jobs(values: Any) -> list[tuple[int, str, str]]:
    if type(values) is str:
        return decode_jobs(values)
    if type(values) is not tuple:
        raise TypeError("jobs must be a plain tuple of (exec_id, family, payload_json) tuples")
    for job in values:
        if (
            type(job) is not tuple
            or len(job) != 3
            or type(job[0]) is not int
            or type(job[1]) is not str
            or type(job[2]) is not str
        ):
            raise TypeError("each job is a plain tuple (exec_id: int, family: str, payload: str)")
    return list(values)


class AgentService(rpyc.Service):
    """The calls a master may make. Arguments are checked to be value types.

    Every call but ``ping``, ``families`` and ``init`` starts with a *stamp*: the
    master's epoch, or ``(epoch, session, since)`` (see the module docstring).
    """

    def __init__(self, core: AgentCore) -> None:
        super().__init__()
        self._core = core

    def _heard(self, stamp: Any) -> bool:
        if type(stamp) is int:
            return self._core.hear(stamp, None, 0.0)
        if (
            type(stamp) is not tuple
            or len(stamp) != 3
            or type(stamp[0]) is not int
            or type(stamp[1]) is not int
            or type(stamp[2]) not in (int, float)
        ):
            raise TypeError("the stamp is an epoch or a plain tuple (epoch, session, since)")
        return self._core.hear(stamp[0], stamp[1], max(0.0, float(stamp[2])))

    def _call(self, stamp: Any, fn: Any, *args: Any) -> Any:
        resume = self._heard(stamp)
        try:
            return fn(*args)
        finally:
            if resume:  # after the call: what it cancels must not start in between
                self._core.resume()

    def exposed_ping(self) -> tuple[str, int, float]:
        return (self._core.name, self._core.epoch, time.time())

    def exposed_families(self) -> tuple[tuple[str, str, bool], ...]:
        return self._core.family_list()

    def exposed_init(self, master_id: str, epoch: int, settings_json: str) -> str:
        return self._core.init(
            _str(master_id, "master id"), _int(epoch, "epoch"), _str(settings_json, "settings")
        )

    def exposed_send(self, epoch: Any, jobs: tuple) -> tuple[tuple[int, str], ...]:
        return self._call(epoch, self._core.send, _jobs(jobs))

    def exposed_done(
        self, epoch: Any, ack: tuple | str, limit: int, framed: bool = False
    ) -> tuple[Done, ...] | str:
        """Held results (acknowledging ``ack`` first); one framed str when ``framed``."""
        rows = self._call(epoch, self._core.take, "done", _ids(ack), _int(limit, "limit"))
        return encode_done(rows) if framed is True else rows

    def exposed_failed(
        self, epoch: Any, ack: tuple | str, limit: int, framed: bool = False
    ) -> tuple[Failed, ...] | str:
        rows = self._call(epoch, self._core.take, "failed", _ids(ack), _int(limit, "limit"))
        return encode_failed(rows) if framed is True else rows

    def exposed_ack(self, epoch: Any, ids: tuple) -> int:
        return self._call(epoch, self._core.ack, _ids(ids))

    def exposed_remaining(self, epoch: Any) -> tuple[int, int, int, int]:
        return self._call(epoch, self._core.remaining)

    def exposed_take_back(self, epoch: Any, count: int, ids: tuple) -> tuple[int, ...]:
        return self._call(epoch, self._core.take_back, _int(count, "count"), _ids(ids))

    def exposed_cancel(self, epoch: Any, ids: tuple) -> tuple[int, ...]:
        return self._call(epoch, self._core.cancel, _ids(ids))

    def exposed_held(self, epoch: Any, ids: tuple) -> tuple[int, ...]:
        return self._call(epoch, self._core.held, _ids(ids))


def make_server(
    settings: Settings, listen: str | None = None, name: str | None = None
) -> ThreadedServer:
    """Build (not start) the agent's server; refuses to start without a secret or TLS.

    Loopback is no exception: any local user could otherwise command the agent, and
    one who binds its port first would receive the master's jobs.
    """
    address = listen or settings.agent_listen
    host, port = split_address(address)
    require_auth(settings, f"refusing to listen on {address}")
    core = AgentCore(
        name or f"{socket.gethostname()}:{port}",
        slots=settings.agent_slots,
        async_slots=settings.agent_async_slots,
        loop=settings.agent_loop,
        speed=settings.agent_speed,
        detach=settings.agent_detach,
    )
    service = AgentService(core)
    try:
        server = GuardedServer(
            service,
            settings,
            hostname=host,
            ipv6=":" in host,  # e.g. [::1]:PORT
            port=port,
            reuse_addr=True,
            protocol_config=dict(STRICT_CONFIG),
            logger=logging.getLogger("jodl.agent.rpyc"),
        )
    except OSError as exc:
        core.close()
        raise JodlError(f"cannot listen on {address}: {exc.strerror or exc}") from None
    server.core = core  # type: ignore[attr-defined]
    return server
