"""The job book: where every job the master holds is, changed only by named transitions.

A job the master holds (a job of an open run without a committed result, or a
claimed on-demand job) is in exactly one of three stages::

                 place / move                 send / attach
    WAITING ───────────────────▶ QUEUED ───────────────────▶ IN FLIGHT ──▶ finish, drop
       ▲  ▲                        │                             │
       │  └──── give_back, lose ───┘                             │
       └────────────── fail (retry), lose, take_back ────────────┘

* **waiting** — needs a node (new, failed elsewhere, its node gone, taken back);
* **queued** on a node — placed there with an expected duration, not sent yet;
* **in flight** — sent to a node's agent as one execution (or two: a backup copy),
  no outcome committed yet.

``cancel``, ``hold_back`` and ``drop`` take a job out of the book from any stage.
The book also keeps, per job, the failures per node in the current run (and the
node to retry on), home changes not written yet, and per dispatch the number of
its executions still open.

Invariants (:func:`jodl.master.invariants.check_book` asserts them; the tests
call it after every transition):

1. every held job has exactly one stage;
2. a waiting job is in the waiting line, is placed nowhere and has no execution;
3. a queued job is placed on one node (node, expected seconds) and is in that
   node's queue once, in no other queue, and has no execution;
4. a job in flight is placed, is in no queue, and has one execution in flight or
   (with a backup copy) the two or more listed in ``copies``; each execution in
   flight is on the node it is filed under, has an execution id, and belongs to a
   held job in flight;
5. a backup copy is an execution in flight;
6. an open dispatch counts exactly its executions in flight;
7. a node's ``queued_jobs`` (placement's view) is the number of jobs placed on it;
8. a job to retry on a node is waiting.

The book does no I/O and each transition costs O(1) per job it moves (``cancel``
and ``hold_back``, rare, scan the queues they take jobs out of). It never builds
execution rows: the transitions return the closed executions (:class:`Closed`) and
the caller writes them to the log.
The book in the loop, as a diagram of every transition: docs/architecture.md#the-job-book.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

from ..log.records import PendingJob, Sent
from ..placement import NodeLoad

#: Jobs of a node's queue looked at per send to pass over those of families at their
#: FamilyOnNode cap there: a cap holds back few jobs, and the window bounds the scan of
#: a long queue that mostly waits for the capped family.
CAP_SCAN = 1024


class Stage(enum.Enum):
    """Where a held job is."""

    WAITING = "waiting"
    QUEUED = "queued"
    IN_FLIGHT = "in flight"


#: The stages as module names: the book compares stages a dozen times per job, and on
#: Python 3.11 an enum member read through its class (``Stage.WAITING``) costs 0.14 µs
#: against 0.02 µs for a global, about 2 µs per job in the master's loop.
WAITING, QUEUED, IN_FLIGHT = Stage.WAITING, Stage.QUEUED, Stage.IN_FLIGHT


class Closed(NamedTuple):
    """An execution taken out of flight: its id, what was sent, whether it was a backup."""

    exec_id: int
    sent: Sent
    backup: bool


class Finished(NamedTuple):
    """A job whose result came: its execution, the job, where it was placed, copies stopped."""

    closed: Closed
    job: PendingJob
    placed: tuple[int, float] | None
    superseded: list[Closed]


class Failure(enum.Enum):
    """What a failed execution made of its job."""

    COPY_RUNS = "another copy runs"
    ON_DEMAND = "on-demand: back to its queue"
    DEAD = "dead"
    RETRY = "waiting again"


class Failed(NamedTuple):
    closed: Closed
    job: PendingJob
    then: Failure


class JobBook:
    """Every held job's whereabouts (see the module's docstring for stages and invariants)."""

    def __init__(self) -> None:
        #: job id -> the job, for every held job.
        self.jobs: dict[int, PendingJob] = {}
        #: job id -> its stage.
        self.stage: dict[int, Stage] = {}
        #: Waiting jobs, oldest first; may also hold ids of jobs that left the stage
        #: (skipped by :meth:`waiting_jobs`), so leaving it costs O(1).
        self.waiting_line: deque[int] = deque()
        #: job id -> (node id, expected seconds) while queued or in flight.
        self.placed: dict[int, tuple[int, float]] = {}
        #: node id -> its queued job ids, the next to send first.
        self.queues: dict[int, deque[int]] = {}
        #: node id -> {execution id: what was sent} of its executions in flight.
        self.flights: dict[int, dict[int, Sent]] = {}
        #: job id -> {execution id: node id} while a job runs in two or more copies.
        self.copies: dict[int, dict[int, int]] = {}
        #: Execution ids of backup copies in flight.
        self.backups: set[int] = set()
        #: node id -> placement's view of it (its queued_jobs/queued_work kept here).
        self.loads: dict[int, NodeLoad] = {}
        #: (job, node) -> failures in the current run.
        self.node_failures: dict[tuple[int, int], int] = {}
        #: job id -> the node that failed it fewer than the family's K times: retried there.
        self.retry_on: dict[int, int] = {}
        #: job id -> (permanent, trial) decided and not written yet.
        self.home_changes: dict[int, tuple[int | None, int | None]] = {}
        #: dispatch id -> its executions in flight.
        self.dispatch_left: dict[int, int] = {}
        self._closed_dispatches: list[int] = []
        self.n_waiting = 0

    # -- nodes --------------------------------------------------------------------------

    def add_node(self, load: NodeLoad) -> None:
        """A node jobs may be placed on (again: a node back after removal gets a new load)."""
        self.loads[load.id] = load
        self.queues.setdefault(load.id, deque())
        self.flights.setdefault(load.id, {})

    # -- waiting -------------------------------------------------------------------------

    def hold(self, job: PendingJob) -> None:
        """A new job (of a run, or claimed on demand) starts waiting for a node."""
        self.jobs[job.id] = job
        self._set_stage(job.id, WAITING)
        self.waiting_line.append(job.id)

    def waiting_jobs(self, limit: int | None = None) -> list[PendingJob]:
        """The waiting jobs, oldest first (they stay waiting until placed); the oldest
        ``limit`` only, with the line walked no further than it takes to find them (a
        step places 20,000 of a window of 50,000: the whole line walked every step
        cost a repeat cycle of no-op jobs 0.3 µs of the loop's CPU a job)."""
        line, stage, seen = self.waiting_line, self.stage, set()
        out: list[PendingJob] = []
        while line and (limit is None or len(out) < limit):
            job_id = line.popleft()
            if stage.get(job_id) is WAITING and job_id not in seen:
                seen.add(job_id)
                out.append(self.jobs[job_id])
        line.extendleft(job.id for job in reversed(out))  # still waiting, still first
        return out

    def has_waiting(self) -> bool:
        return self.n_waiting > 0

    def _wait(self, job_id: int) -> None:
        self._unplace(job_id)
        self._set_stage(job_id, WAITING)
        self.waiting_line.append(job_id)

    def _set_stage(self, job_id: int, stage: Stage | None) -> None:
        """The one place a stage changes (keeps the count of waiting jobs)."""
        old = self.stage.pop(job_id, None) if stage is None else self.stage.get(job_id)
        if stage is not None:
            self.stage[job_id] = stage
        self.n_waiting += (stage is WAITING) - (old is WAITING)

    # -- placing -------------------------------------------------------------------------

    def place(
        self,
        job_id: int,
        node_id: int,
        expected: float,
        *,
        counted: bool = False,
        front: bool = False,
    ) -> None:
        """WAITING -> QUEUED on ``node_id``, expected to take ``expected`` seconds there.

        ``counted``: placement already added the job to the node's ``queued_*``.
        ``front``: it goes first (a steal keeps the thief's longest job first).
        """
        assert self.stage[job_id] is WAITING, (job_id, self.stage[job_id])
        self.retry_on.pop(job_id, None)  # wherever it goes now, the hint is spent
        self._to_node(job_id, node_id, expected, counted)
        self._set_stage(job_id, QUEUED)
        if front:
            self.queues[node_id].appendleft(job_id)
        else:
            self.queues[node_id].append(job_id)

    def take_retry_node(self, job_id: int) -> int | None:
        """The node a failed job should be retried on (fewer than K failures there), once."""
        return self.retry_on.pop(job_id, None)

    def _to_node(self, job_id: int, node_id: int, expected: float, counted: bool) -> None:
        self.placed[job_id] = (node_id, expected)
        if not counted:
            load = self.loads[node_id]
            load.queued_jobs += 1
            load.queued_work += expected

    def _unplace(self, job_id: int) -> None:
        placed = self.placed.pop(job_id, None)
        if placed is not None:
            node_id, expected = placed
            load = self.loads[node_id]
            load.queued_jobs -= 1
            load.queued_work = max(0.0, load.queued_work - expected)

    def move_tail(self, source: int, targets: dict[int, tuple[int, float]]) -> list[int]:
        """QUEUED -> QUEUED: jobs from the end of ``source``'s queue to the front of
        their targets' (``{job: (node, expected)}``); the ids moved."""
        queue = self.queues[source]
        wanted, kept, moved = set(targets), [], []
        while wanted and queue:
            job_id = queue.pop()
            if job_id in wanted:
                wanted.discard(job_id)
                moved.append(job_id)
            else:
                kept.append(job_id)
        queue.extend(reversed(kept))
        for job_id in moved:
            self._requeue(job_id, *targets[job_id])
        return moved

    def move(self, job_id: int, node_id: int, expected: float) -> bool:
        """QUEUED -> QUEUED on another node (to the front); False if it is not queued."""
        placed = self.placed.get(job_id)
        if self.stage.get(job_id) is not QUEUED or placed is None or placed[0] == node_id:
            return False
        self.queues[placed[0]].remove(job_id)
        self._requeue(job_id, node_id, expected)
        return True

    def _requeue(self, job_id: int, node_id: int, expected: float) -> None:
        self._unplace(job_id)
        self._to_node(job_id, node_id, expected, counted=False)
        self.queues[node_id].appendleft(job_id)

    def give_back(self, node_id: int) -> list[int]:
        """QUEUED on ``node_id`` -> WAITING, every one (the node may not run them now)."""
        queue = self.queues[node_id]
        ids = list(queue)
        queue.clear()
        for job_id in ids:
            self._wait(job_id)
        return ids

    # -- sending -------------------------------------------------------------------------

    def pick(self, node_id: int, take: int, caps: dict[str, int] | None = None) -> list[int]:
        """Up to ``take`` queued jobs of ``node_id`` to send now; :meth:`send` them next.

        With ``caps`` (FamilyOnNode.max_slots), none of a family beyond its cap on the
        node: a job in flight may be running, so counting those keeps the agent from
        ever running more than the cap at once.
        """
        queue = self.queues[node_id]
        if not caps:
            return [queue.popleft() for _ in range(min(take, len(queue)))]
        jobs = self.jobs
        busy = dict.fromkeys(caps, 0)
        for sent in self.flights[node_id].values():
            job = jobs.get(sent.job_id)
            if job is not None and job.family in busy:
                busy[job.family] += 1
        taken: list[int] = []
        held: deque[int] = deque()
        while queue and len(taken) < take and len(held) < CAP_SCAN:
            job_id = queue.popleft()
            family = jobs[job_id].family
            if family in busy:
                if busy[family] >= caps[family]:
                    held.append(job_id)
                    continue
                busy[family] += 1
            taken.append(job_id)
        if held:
            held.extend(queue)
            self.queues[node_id] = held
        return taken

    def send(self, node_id: int, sents: Iterable[Sent]) -> None:
        """QUEUED (picked) -> IN_FLIGHT: the executions just logged for ``node_id``."""
        flights = self.flights[node_id]
        left = self.dispatch_left
        for sent in sents:
            flights[sent.exec_id] = sent
            self._set_stage(sent.job_id, IN_FLIGHT)
            left[sent.dispatch_id] = left.get(sent.dispatch_id, 0) + 1

    def attach(self, sent: Sent, expected: float) -> None:
        """WAITING -> IN_FLIGHT: after a restart, an execution its agent still holds."""
        assert self.stage[sent.job_id] is WAITING
        self._to_node(sent.job_id, sent.node_id, expected, counted=False)
        self.send(sent.node_id, [sent])

    def add_backup(self, sent: Sent, straggler: int, straggler_node: int) -> None:
        """IN_FLIGHT: a backup copy ``sent`` of the job of execution ``straggler``."""
        assert self.stage[sent.job_id] is IN_FLIGHT
        self.copies[sent.job_id] = {straggler: straggler_node, sent.exec_id: sent.node_id}
        self.backups.add(sent.exec_id)
        self.send(sent.node_id, [sent])

    # -- outcomes ------------------------------------------------------------------------

    def _close(self, node_id: int, exec_id: int) -> Closed | None:
        sent = self.flights[node_id].pop(exec_id, None)
        if sent is None:
            return None
        left = self.dispatch_left.get(sent.dispatch_id, 1) - 1
        if left <= 0:
            self.dispatch_left.pop(sent.dispatch_id, None)
            self._closed_dispatches.append(sent.dispatch_id)
        else:
            self.dispatch_left[sent.dispatch_id] = left
        backup = exec_id in self.backups
        if backup:
            self.backups.discard(exec_id)
        return Closed(exec_id, sent, backup)

    def _other_copy(self, job_id: int, exec_id: int) -> bool:
        """Forget copy ``exec_id`` of ``job_id``; True when another copy still runs."""
        copies = self.copies.get(job_id)
        if not copies or exec_id not in copies:
            return False
        del copies[exec_id]
        if len(copies) <= 1:
            self.copies.pop(job_id, None)
        return bool(copies)

    def finish(self, node_id: int, exec_id: int) -> Finished | Closed | None:
        """IN_FLIGHT -> out: a result of execution ``exec_id``; its other copies close too.

        A :class:`Closed` alone when the execution's job is not held any more (its
        result only gets acknowledged); None when the execution is not in flight.
        """
        closed = self._close(node_id, exec_id)
        if closed is None:
            return None
        job = self.jobs.get(closed.sent.job_id)
        if job is None:
            return closed
        superseded = []
        copies = self.copies.pop(job.id, None)
        for other_exec, other_node in copies.items() if copies else ():
            if other_exec != exec_id:
                other = self._close(other_node, other_exec)
                if other is not None:
                    superseded.append(other)
        placed = self.placed.get(job.id)
        self.drop(job.id)
        return Finished(closed, job, placed, superseded)

    def fail(
        self, node_id: int, exec_id: int, retryable: bool, max_attempts: int, moves_after: int
    ) -> Failed | Closed | None:
        """A failed execution; the job's attempt counts (unless another copy runs).

        An on-demand job leaves the book (its queue retries it); a job of a run
        that used up its attempts (or failed for good) leaves it as dead; others
        wait again, to be retried on the same node until it failed them
        ``moves_after`` times in this run, then elsewhere.
        """
        closed = self._close(node_id, exec_id)
        if closed is None:
            return None
        job = self.jobs.get(closed.sent.job_id)
        if job is None:
            return closed
        if self._other_copy(job.id, exec_id):
            return Failed(closed, job, Failure.COPY_RUNS)
        job.attempts += 1
        if job.claim is not None:
            self.drop(job.id)
            return Failed(closed, job, Failure.ON_DEMAND)
        key = (job.id, node_id)
        self.node_failures[key] = self.node_failures.get(key, 0) + 1
        if self.node_failures[key] >= moves_after:
            job.failed_on = job.failed_on | {node_id}
            self.retry_on.pop(job.id, None)
        else:
            self.retry_on[job.id] = node_id
        if not retryable or job.attempts >= max_attempts:
            self.drop(job.id)
            return Failed(closed, job, Failure.DEAD)
        self._wait(job.id)
        return Failed(closed, job, Failure.RETRY)

    def lose(self, node_id: int) -> list[Closed]:
        """The node is gone or unreachable: its executions close, its jobs wait again.

        A job with a copy running elsewhere stays in flight there.
        """
        closed = []
        for exec_id in list(self.flights[node_id]):
            gone = self._close(node_id, exec_id)
            assert gone is not None
            closed.append(gone)
            job_id = gone.sent.job_id
            if job_id in self.jobs and not self._other_copy(job_id, exec_id):
                self._wait(job_id)
        self.give_back(node_id)
        return closed

    def take_back(self, node_id: int, exec_id: int) -> Closed | None:
        """IN_FLIGHT -> WAITING: the agent gave execution ``exec_id`` back unstarted."""
        closed = self._close(node_id, exec_id)
        if closed is not None:
            job_id = closed.sent.job_id
            if job_id in self.jobs and not self._other_copy(job_id, exec_id):
                self._wait(job_id)
        return closed

    # -- leaving the book ------------------------------------------------------------------

    def drop(self, job_id: int) -> PendingJob | None:
        """Any stage -> out (result committed, dead, cancelled). Executions must be closed."""
        job = self.jobs.pop(job_id, None)
        stage = self.stage.get(job_id)
        self._set_stage(job_id, None)
        if stage is QUEUED:
            placed = self.placed.get(job_id)
            if placed is not None:
                self.queues[placed[0]].remove(job_id)
        self._unplace(job_id)
        self.copies.pop(job_id, None)
        self.retry_on.pop(job_id, None)
        return job

    def cancel(self, job_ids: Iterable[int]) -> dict[int, list[Closed]]:
        """Jobs deleted (or claimed elsewhere) leave the book; their executions, by node."""
        ids = {j for j in job_ids if j in self.jobs}
        closed: dict[int, list[Closed]] = {}
        for node_id, flights in self.flights.items() if ids else ():
            for exec_id in [e for e, s in flights.items() if s.job_id in ids]:
                gone = self._close(node_id, exec_id)
                assert gone is not None
                closed.setdefault(node_id, []).append(gone)
        self._drop_all(ids)
        return closed

    def hold_back(self, run_id: int) -> list[int]:
        """A run's jobs not in flight leave the book (its bytes budget is spent)."""
        ids = {j for j, job in self.jobs.items() if job.run_id == run_id}
        ids = {j for j in ids if self.stage[j] is not IN_FLIGHT}
        self._drop_all(ids)
        return sorted(ids)

    def _drop_all(self, ids: set[int]) -> None:
        """Take ``ids`` out of every queue in one pass, then out of the book."""
        for node_id, queue in self.queues.items() if ids else ():
            if any(j in ids for j in queue):
                self.queues[node_id] = deque(j for j in queue if j not in ids)
        for job_id in ids:
            self._set_stage(job_id, WAITING)  # out of every queue already
            self.drop(job_id)

    # -- homes and dispatches ---------------------------------------------------------------

    def set_home(self, job: PendingJob, permanent: int | None, trial: int | None) -> None:
        """A job's home (and trial node) changes; written by the next :meth:`take_home_changes`."""
        if (job.permanent_node_id, job.trial_node_id) != (permanent, trial):
            job.permanent_node_id, job.trial_node_id = permanent, trial
            self.home_changes[job.id] = (permanent, trial)

    def take_home_changes(self) -> dict[int, tuple[int | None, int | None]]:
        changes, self.home_changes = self.home_changes, {}
        return changes

    def lost_after_restart(self, sent: Sent) -> None:
        """After a restart: an execution of a logged dispatch its agent no longer holds
        (closed as lost by the caller); its dispatch closes if nothing of it is attached."""
        if not self.dispatch_left.get(sent.dispatch_id):
            self._closed_dispatches.append(sent.dispatch_id)

    def take_closed_dispatches(self) -> list[int]:
        closed, self._closed_dispatches = self._closed_dispatches, []
        return closed

    def end_of_run(self) -> None:
        """Failures per node count per run."""
        self.node_failures.clear()
        self.retry_on.clear()
