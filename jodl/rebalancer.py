"""The master's balancing steps (thesis: the reasons to move a job), as a part of the master.

:class:`Rebalancer` is mixed into :class:`jodl.master.Master`; it holds the steps
of the loop that move jobs, each a method named after the step:

    make_trial_moves   when a cycle opens: decide open trials, explore, share to new nodes
    balance            an idle agent takes unstarted jobs from the one that ends last
    check_timeouts     take jobs back from an agent past its family's timeout
    review_durations   after results: trial verdicts, and trial moves for slow jobs
    run_backups        near a cycle's end: backup copies of stragglers (idempotent families)

The decisions themselves are pure functions in :mod:`jodl.balance`; this module
gathers the master's state for them and carries them out, logging every change
of a job's home to the reconstruction log (so a restart keeps trial moves).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import time
from collections.abc import Sequence
from itertools import islice
from typing import TYPE_CHECKING, Any

from . import balance
from .balance import REMOVED, UNREACHABLE, USABLE, Queue, Running, Steal, Tuning, Waiting
from .exceptions import AgentUnavailable
from .log.models import ExecState, Family, utcnow
from .placement import BalanceView, JobInfo, Move, NodeLoad, Placement
from .placement import Waiting as WaitingView

if TYPE_CHECKING:
    from .log.records import PendingJob
    from .master import ActiveRun, Flight, NodeSlot

log = logging.getLogger("jodl.master")

#: Most waiting jobs of one node looked at per balance step (from the end of its queue).
STEAL_WINDOW = 256
#: While jobs run, the master polls again within this share of the shortest one's
#: expected duration: a result is seen soon after it is ready (the makespan ends
#: only when the master sees the last result) without a tight loop for long jobs.
POLL_SHARE = 0.02
#: ... but not more often than this (seconds).
POLL_FLOOR = 0.001


def job_info(job: PendingJob) -> JobInfo:
    """What placement may know of a pending job."""
    return JobInfo(
        job.id,
        job.key,
        job.family,
        job.priority,
        job.permanent_node_id,
        job.trial_node_id,
        frozenset(job.failed_on) if job.failed_on else _NONE,
        job.attempts,
    )


_NONE: frozenset[int] = frozenset()


def _unix(when: dt.datetime) -> float:
    return when.replace(tzinfo=dt.UTC).timestamp()


class Rebalancer:
    """Balancing steps of the master loop; expects the attributes of :class:`Master`."""

    # Provided by Master (declared for readers and type checkers).
    nodes: dict[int, NodeSlot]
    pending: dict[int, PendingJob]
    placed: dict[int, tuple[int, float]]
    strategies: dict[str, Placement]
    runs: dict[int, ActiveRun]
    store: Any
    writer: Any
    knowledge: Any
    epoch: int
    unassigned: Any
    dispatch_left: dict[int, int]

    def _balancing_init(self) -> None:
        self.tuning: dict[str, Tuning] = {}
        self.rules: dict[str, dict[int, Any]] = {}
        #: job -> {exec_id: node_id} while a job runs in more than one copy (backups).
        self.copies: dict[int, dict[int, int]] = {}
        #: node -> execution ids to cancel on its agent (copies that lost the race).
        self.to_cancel: dict[int, list[int]] = {}
        #: (job, node, duration) of results committed since the last review.
        self.reviews: list[tuple[PendingJob, int, float]] = []
        #: job -> (permanent, trial) decided and not yet written.
        self.home_changes: dict[int, tuple[int | None, int | None]] = {}
        #: (job, node) -> failures in the current run.
        self.node_failures: dict[tuple[int, int], int] = {}
        #: job -> the node that failed it fewer than ``attempts_before_move`` times.
        self.retry_on: dict[int, int] = {}
        #: Nodes past a timeout: no new jobs until they report a result or run nothing.
        self.late: set[int] = set()
        #: node -> unix time of the last result it reported.
        self.last_finish: dict[int, float] = {}
        #: node -> [actual seconds, expected seconds] of its results in this run.
        self.drift: dict[int, list[float]] = {}
        #: run -> job -> (node, seconds) of each committed result, for the lower bound.
        self.run_works: dict[int, dict[int, tuple[int, float]]] = {}
        self.rng = random.Random()

    # -- what the steps share ------------------------------------------------------------------

    def family_tuning(self, family: Family) -> dict[str, Any]:
        """Read a family's balancing knobs and rules; returns the strategy's own parameters."""
        tuning, params = Tuning.split(
            family.strategy_params, timeout=family.timeout, idempotent=bool(family.idempotent)
        )
        self.tuning[family.name] = tuning
        self.rules[family.name] = self.store.family_rules(family.id)
        return params

    def _tuned(self, family: str) -> Tuning:
        return self.tuning.get(family) or Tuning()

    def allowed(self, family: str, slot: NodeSlot) -> bool:
        """May ``slot`` run ``family`` now: the agent has it, FamilyOnNode allows, not late."""
        if not slot.usable or family not in slot.families or slot.load.id in self.late:
            return False
        rule = self.rules.get(family, {}).get(slot.load.id)
        if rule is None:
            return True
        return balance.allows(rule.allowed, rule.conditions, slot.load.labels)

    def candidates(self, family: str) -> list[NodeLoad]:
        """The nodes placement may choose from for ``family``."""
        return [s.load for s in self.nodes.values() if self.allowed(family, s)]

    def node_state(self, node_id: int) -> str:
        slot = self.nodes.get(node_id)
        if slot is None or slot.removed:
            return REMOVED
        return USABLE if slot.usable else UNREACHABLE

    def _set_home(self, job: PendingJob, permanent: int | None, trial: int | None) -> None:
        if (job.permanent_node_id, job.trial_node_id) != (permanent, trial):
            job.permanent_node_id, job.trial_node_id = permanent, trial
            self.home_changes[job.id] = (permanent, trial)

    def _write_homes(self) -> None:
        """Hand the homes decided since the last call to the log writer (committed in order)."""
        if self.home_changes:
            changes, self.home_changes = self.home_changes, {}
            self.writer.submit((), homes=[(j, p, t) for j, (p, t) in changes.items()])

    def _drift(self, node_id: int) -> float:
        """How much longer than expected this node's jobs took in this run (1.0: as expected)."""
        actual, expected = self.drift.get(node_id, (0.0, 0.0))
        return actual / expected if actual > 0 and expected > 0 else 1.0

    def _running(self, slot: NodeSlot, now: float) -> list[tuple[int, Flight, float]]:
        """(exec_id, flight, started) of the executions the agent is most likely running.

        The agent runs its queue in order, so these are the oldest ones, one per
        slot; one started when it was sent or when the node last finished a job.
        """
        out = []
        last = self.last_finish.get(slot.load.id, 0.0)
        for exec_id, flight in islice(slot.inflight.items(), max(1, slot.load.slots)):
            out.append((exec_id, flight, min(now, max(_unix(flight.sent_at), last))))
        return out

    def poll_cap(self) -> float:
        """Longest pause of the loop now: :data:`POLL_SHARE` of the shortest running job.

        A job's length is its expected duration, or how long it has run already
        when that is longer (a job far past its estimate is not polled in a tight
        loop).
        """
        shortest = float("inf")
        now = time.time()
        for slot in self.nodes.values():
            if slot.inflight and slot.usable:
                for _exec_id, flight, started in self._running(slot, now):
                    placed = self.placed.get(flight.job_id)
                    if placed is not None:
                        shortest = min(shortest, max(placed[1], now - started))
        return max(POLL_FLOOR, POLL_SHARE * shortest)

    # -- hooks called by the master's collect and node steps -------------------------------

    def note_done(
        self, slot: NodeSlot, job: PendingJob, exec_id: int, duration: float, rows: list[Any]
    ) -> None:
        """A result of ``job`` is about to be committed: learn from it, cancel other copies."""
        node_id = slot.load.id
        self.late.discard(node_id)
        self.last_finish[node_id] = time.time()
        placed = self.placed.get(job.id)
        if placed is not None and placed[0] == node_id:
            acc = self.drift.setdefault(node_id, [0.0, 0.0])
            acc[0] += duration
            acc[1] += placed[1]
        if job.run_id is not None:
            self.run_works.setdefault(job.run_id, {})[job.id] = (node_id, duration)
        self.reviews.append((job, node_id, duration))
        if not self.copies:
            return
        for other_exec, other_node in self.copies.pop(job.id, {}).items():
            other = self.nodes.get(other_node)
            flight = other.inflight.pop(other_exec, None) if other is not None else None
            if other_exec == exec_id or flight is None:
                continue
            rows.append(
                self._outcome(  # type: ignore[attr-defined]
                    other_exec,
                    flight,
                    ExecState.CANCELLED,
                    error=(
                        f"superseded: the copy on node {node_id} finished first; this copy "
                        "may have started (its result, if any, is discarded)"
                    ),
                )
            )
            self.to_cancel.setdefault(other_node, []).append(other_exec)

    def note_failure(self, job: PendingJob, node_id: int) -> None:
        """A failure of ``job`` on ``node_id``: after K of them in this run, avoid the node."""
        key = (job.id, node_id)
        self.node_failures[key] = self.node_failures.get(key, 0) + 1
        if self.node_failures[key] >= self._tuned(job.family).attempts_before_move:
            job.failed_on.add(node_id)
            self.retry_on.pop(job.id, None)
        else:
            self.retry_on[job.id] = node_id

    def retry_in_place(self, jobs: list[JobInfo]) -> list[JobInfo]:
        """Put jobs that failed on a node fewer than K times back on it; return the others."""
        if not self.retry_on:
            return jobs
        rest = []
        for info in jobs:
            node_id = self.retry_on.pop(info.id, None)
            slot = self.nodes.get(node_id) if node_id is not None else None
            if slot is None or not self.allowed(info.family, slot):
                rest.append(info)
                continue
            expected = self._expected_now(info, slot.load)
            self.placed[info.id] = (slot.load.id, expected)
            slot.load.queued_jobs += 1
            slot.load.queued_work += expected
            slot.backlog.append(info.id)
        return rest

    def other_copy(self, job_id: int, exec_id: int) -> bool:
        """Forget copy ``exec_id`` of ``job_id``; True when another copy still runs."""
        copies = self.copies.get(job_id)
        if not copies or exec_id not in copies:
            return False
        del copies[exec_id]
        if len(copies) <= 1:
            self.copies.pop(job_id, None)
        return bool(copies)

    def node_gone(self, node_id: int) -> None:
        """A node removed for good: its trial moves become permanent, its homes are freed."""
        self._write_homes()
        self.writer.flush()  # homes decided before are written before they are freed
        self.store.node_gone_for_good(node_id)
        for job in self.pending.values():  # the same change in memory
            if job.permanent_node_id == node_id:
                job.permanent_node_id, job.trial_node_id = job.trial_node_id, None
            elif job.trial_node_id == node_id:
                job.trial_node_id = None

    # -- make_trial_moves --------------------------------------------------------------------------

    def make_trial_moves(self, active: ActiveRun, jobs: Sequence[PendingJob]) -> None:
        """When a cycle opens: decide open trials, give new nodes a share, explore at random.

        Also sets each node's expected work per cycle of the jobs whose home it is
        (weighted by how often each job is due), which placement sees.
        """
        fam = active.family.name
        tuning = self._tuned(fam)
        nodes = self.candidates(fam)
        for job in jobs:
            trial = job.trial_node_id
            if trial is None or job.permanent_node_id is None:
                continue
            tried = self.knowledge.learned(job.id, trial)
            if self.node_state(job.permanent_node_id) == REMOVED or (tried and tried.count):
                # decide as if it had just run there: permanent, reverted or still open
                self._set_home(
                    job,
                    *balance.verdict(
                        job_info(job),
                        trial,
                        self.knowledge,
                        self.node_state,
                        tuning.faster_by,
                        tuning.min_gain,
                    ),
                )
        shared: list[tuple[int, int]] = []
        known = [self.knowledge.family_mean(fam, n.id) is not None for n in nodes]
        if tuning.new_node_share and any(known) and not all(known):
            infos = [job_info(job) for job in jobs]
            shared = balance.new_node_share(infos, nodes, self.knowledge, fam, self.rng)
            for job_id, node_id in shared:
                self._set_home(self.pending[job_id], node_id, None)  # its new home
        # Each job is explored with probability ``explore``: draw first, describe the few.
        drawn = [j for j in jobs if j.trial_node_id is None and self.rng.random() < tuning.explore]
        picked = [job_info(job) for job in drawn]
        moves = balance.explore(picked, nodes, self.knowledge, 1.0, self.rng)
        for job_id, node_id in moves:
            job = self.pending[job_id]
            self._set_home(job, job.permanent_node_id, node_id)
        if moves or shared:
            log.info(
                "run %s#%d: %d jobs to new nodes, %d trial moves",
                fam,
                active.run.number,
                len(shared),
                len(moves),
            )
        self._write_homes()
        self.writer.flush()  # the homes just decided count in the query below
        period = self.store.cycle_period(active.family.id)
        default = self.knowledge.family_mean(fam) or self.knowledge.default_duration
        work = self.store.home_work(active.family.id, default, period)
        for node in nodes:
            node.home_work = work.get(node.id, 0.0)

    # -- balance -------------------------------------------------------------------------------

    def balance(self) -> int:
        """An idle agent takes unstarted jobs from the agent expected to finish last.

        Jobs not sent yet move at once; jobs on the agent are asked back (protocol
        f) and move only if the agent confirms they had not started. A move is made
        only if the job ends earlier on the idle node by more than the round trip
        plus a margin (:func:`jodl.balance.plan_steals`).
        """
        usable = [s for s in self.nodes.values() if s.usable]
        idle = [
            s
            for s in usable
            if not s.backlog
            and len(s.inflight) < max(1, s.load.slots)
            and s.load.id not in self.late
        ]
        if not idle or len(usable) < 2:
            return 0
        now = time.time()
        queues = {s.load.id: self._queue(s, now, s in idle) for s in usable}
        steals = balance.plan_steals(
            list(queues.values()), self._expected_now, lambda j: self._tuned(j.family).steal_margin
        )
        moved = self._carry_out(steals)
        moved += self._strategy_moves(queues, idle)
        return moved

    def _expected_now(self, job: JobInfo, node: NodeLoad) -> float:
        return float(self.knowledge.expected(job, node))

    def _queue(self, slot: NodeSlot, now: float, idle: bool) -> Queue:
        drift = self._drift(slot.load.id)
        slots = max(1, slot.load.slots)
        done_part = 0.0
        for _exec_id, flight, started in self._running(slot, now):
            placed = self.placed.get(flight.job_id)
            if placed is not None and placed[0] == slot.load.id:
                done_part += min(now - started, placed[1] * drift)
        finish = max(0.0, slot.load.queued_work * drift - done_part) / slots
        waiting: list[Waiting] = []
        if len(slot.backlog) < STEAL_WINDOW:
            for exec_id, flight in islice(slot.inflight.items(), slots, None):
                job = self.pending.get(flight.job_id)
                placed = self.placed.get(flight.job_id)
                if job is None or flight.backup or job.id in self.copies or placed is None:
                    continue
                waiting.append(Waiting(job_info(job), placed[1] * drift, True, exec_id))
        tail = list(slot.backlog)[-STEAL_WINDOW:]
        for job_id in tail:
            job = self.pending.get(job_id)
            placed = self.placed.get(job_id)
            if job is not None and placed is not None:
                waiting.append(Waiting(job_info(job), placed[1] * drift))
        families = frozenset(
            f for f in slot.families if self.allowed(f, slot) and not self._kept(f)
        )
        return Queue(slot.load, finish, waiting, slot.link.rtt, idle, families)

    def _kept(self, family: str) -> bool:
        """Whether the family's strategy keeps its jobs on the nodes it chose."""
        strategy = self.strategies.get(family)
        return strategy is not None and strategy.keeps_nodes

    def _carry_out(self, steals: list[Steal]) -> int:
        moved = 0
        by_source: dict[int, list[Steal]] = {}
        for st in steals:
            by_source.setdefault(st.source, []).append(st)
        for source_id, group in by_source.items():
            source = self.nodes[source_id]
            targets = {st.job_id: st.target for st in group}
            unsent = [st.job_id for st in group if st.exec_id is None]
            wanted, kept = set(unsent), []
            while wanted and source.backlog:  # steals come from the end of the backlog
                job_id = source.backlog.pop()
                if job_id in wanted:
                    wanted.discard(job_id)
                else:
                    kept.append(job_id)
            source.backlog.extend(reversed(kept))
            taken: list[int] = []
            asked = {st.exec_id: st.job_id for st in group if st.exec_id is not None}
            if asked:
                taken = self.take_back(source, list(asked))
            for job_id in unsent + [asked[e] for e in taken]:
                self._move(job_id, self.nodes[targets[job_id]])
                moved += 1
        return moved

    def take_back(self, slot: NodeSlot, exec_ids: list[int]) -> list[int]:
        """Ask the agent for unstarted executions back (f); log the ones it returns."""
        started = time.perf_counter()
        try:
            given = slot.link.take_back(self.epoch, 0, exec_ids)
        except AgentUnavailable:
            self._node_down(slot)  # type: ignore[attr-defined]
            return []
        slot.link.rtt = 0.8 * slot.link.rtt + 0.2 * (time.perf_counter() - started)
        rows = []
        for exec_id in given:
            flight = slot.inflight.pop(exec_id, None)
            if flight is not None:
                rows.append(self._outcome(exec_id, flight, ExecState.TAKEN_BACK))  # type: ignore[attr-defined]
        self._commit(rows)  # type: ignore[attr-defined]
        return [r[0] for r in rows]

    def _move(self, job_id: int, target: NodeSlot) -> None:
        job = self.pending.get(job_id)
        if job is None:
            return
        self._unplace(job_id)  # type: ignore[attr-defined]
        expected = self._expected_now(job_info(job), target.load)
        self.placed[job_id] = (target.load.id, expected)
        target.load.queued_jobs += 1
        target.load.queued_work += expected
        target.backlog.appendleft(job_id)  # steals come shortest first: keep longest first

    def _strategy_moves(self, queues: dict[int, Queue], idle: list[NodeSlot]) -> int:
        """Moves the families' strategies propose (their :meth:`Placement.moves` hook)."""
        hooks = [s for s in self.strategies.values() if type(s).moves is not Placement.moves]
        if not hooks:
            return 0
        waiting = [
            WaitingView(w.job, node_id, w.expected, w.sent)
            for node_id, q in queues.items()
            for w in q.waiting
            if not w.sent and not self._kept(w.job.family)
        ]
        view = BalanceView(
            [q.node for q in queues.values()],
            waiting,
            self.knowledge,
            frozenset(s.load.id for s in idle),
            {n: q.rtt for n, q in queues.items()},
        )
        moved = 0
        for hook in hooks:
            for move in hook.moves(view):
                moved += self._apply_move(move)
        return moved

    def _apply_move(self, move: Move) -> int:
        placed = self.placed.get(move.job_id)
        target = self.nodes.get(move.node_id)
        job = self.pending.get(move.job_id)
        if placed is None or target is None or job is None or not self.allowed(job.family, target):
            return 0
        source = self.nodes[placed[0]]
        if move.job_id not in source.backlog or source is target:
            return 0
        source.backlog.remove(move.job_id)
        self._move(move.job_id, target)
        return 1

    # -- check_timeouts ------------------------------------------------------------------------

    def check_timeouts(self) -> int:
        """Take jobs back from an agent past its family's timeout.

        An execution out longer than its family's ``timeout`` makes its agent late:
        everything it has not started is taken back and placed elsewhere, the late
        execution is cancelled and counts as a failed attempt there, and the node
        gets no new jobs until it has nothing running any more.
        """
        if not any(t.timeout for t in self.tuning.values()):
            return 0
        self._release_late()
        now = time.time()
        handled = 0
        for slot in [s for s in self.nodes.values() if s.usable and s.inflight]:
            late: dict[int, float] = {}
            for exec_id, flight, started in self._running(slot, now):
                job = self.pending.get(flight.job_id)
                if job is None or job.family not in slot.idempotent:
                    # Cancelling only drops the result: the job runs on there. A family
                    # whose class says a second run does harm waits for its outcome.
                    continue
                timeout = self._tuned(job.family).timeout
                if balance.overdue({exec_id: started}, now, timeout):
                    late[exec_id] = now - started
            if not late:
                continue
            self.late.add(slot.load.id)
            log.warning("node %s is past its timeout: taking its jobs back", slot.link.address)
            rest = {e: f.job_id for e, f in slot.inflight.items() if e not in late and not f.backup}
            given = self.take_back(slot, list(rest)) if rest else []
            for job_id in [rest[e] for e in given] + list(slot.backlog):
                self._unplace(job_id)  # type: ignore[attr-defined]
                self.unassigned.append(job_id)
            slot.backlog.clear()
            self._cancel(slot, list(late))
            failed = tuple(
                (e, took, now, f"timed out after {took:.1f}s", True)
                for e, took in late.items()
                if e in slot.inflight
            )
            handled += self._outcomes(slot, (), failed)  # type: ignore[attr-defined]
        return handled

    def _release_late(self) -> None:
        """A late node that runs nothing any more may take jobs again."""
        for node_id in list(self.late):
            slot = self.nodes.get(node_id)
            if slot is None or not slot.usable:
                continue
            try:
                queued, running, _done, _failed = slot.link.remaining(self.epoch)
            except AgentUnavailable:
                self._node_down(slot)  # type: ignore[attr-defined]
                continue
            if not queued and not running:
                self.late.discard(node_id)

    def _cancel(self, slot: NodeSlot, exec_ids: list[int]) -> None:
        if not exec_ids:
            return
        try:
            slot.link.cancel(self.epoch, exec_ids)
        except AgentUnavailable:
            self._node_down(slot)  # type: ignore[attr-defined]

    # -- review_durations ----------------------------------------------------------------------

    def review_durations(self) -> int:
        """After results: decide trial moves, and give slow jobs a trial move elsewhere.

        A job that ran away from its home is on a trial move (permanent if faster
        there, reverted if its home is back and it was not); a job much slower
        than average, or slower than it used to be, gets a trial move to another
        node for its next run. Changes go to the log writer at once.
        """
        reviews, self.reviews = self.reviews, []
        trials = 0
        for job, node_id, duration in reviews:
            tuning = self._tuned(job.family)
            if duration < tuning.slow_floor and job.trial_node_id is None:
                if job.permanent_node_id is None and job.run_id is not None:
                    job.permanent_node_id = node_id  # the log wrote it with the result
                    continue
                if job.permanent_node_id == node_id:
                    continue  # ran at home, too short to be slow: nothing to decide
            info = job_info(job)
            permanent, trial = balance.verdict(
                info, node_id, self.knowledge, self.node_state, tuning.faster_by, tuning.min_gain
            )
            reason = None
            if duration >= tuning.slow_floor:
                reason = balance.slow_reason(
                    info, node_id, duration, self.knowledge, tuning.slow_factor
                )
            if reason is not None and trial is None:
                target = balance.trial_node(
                    info, self.candidates(job.family), self.knowledge, node_id, self.rng
                )
                if target is not None:
                    trial = target
                    trials += 1
                    log.info(
                        "job %s %s on node %s: trial on node %s", job.key, reason, node_id, target
                    )
            self._set_home(job, permanent, trial)
        self._write_homes()
        return trials

    # -- run_backups ---------------------------------------------------------------------------

    def run_backups(self) -> int:
        """Near the end of a cycle, run backup copies of stragglers on idle nodes.

        Only for families idempotent both in the log and in the family class the
        agents run (:attr:`jodl.family.Family.idempotent`: running twice does no
        harm), and only once nothing of the cycle waits to be sent. The first
        committed result wins; the other copy is cancelled (see :meth:`note_done`).
        """
        self._flush_cancels()
        families = {
            a.family.name
            for a in self.runs.values()
            if self._tuned(a.family.name).idempotent and not self._kept(a.family.name)
        }
        if not families or self.unassigned or any(s.backlog for s in self.nodes.values()):
            return 0
        now = time.time()
        running: list[Running] = []
        for slot in self.nodes.values():
            if not slot.usable:
                continue
            for exec_id, flight, started in self._running(slot, now):
                job = self.pending.get(flight.job_id)
                if job is None or job.family not in families or job.id in self.copies:
                    continue
                if job.family not in slot.idempotent:
                    continue
                info = job_info(job)
                expected = self._expected_now(info, slot.load)
                running.append(Running(exec_id, info, slot.load.id, now - started, expected))
        if not running:
            return 0
        sent = 0
        for fam in families:
            idle = [
                s.load
                for s in self.nodes.values()
                if self.allowed(fam, s) and not s.inflight and not s.backlog and fam in s.idempotent
            ]
            mine = [r for r in running if r.job.family == fam]
            factor = self._tuned(fam).backup_factor
            rtt = max((s.link.rtt for s in self.nodes.values() if s.usable), default=0.0)
            for straggler, node in balance.pick_backups(
                mine, idle, self._expected_now, factor, rtt
            ):
                if self._send_backup(straggler, self.nodes[node.id]):
                    sent += 1
        return sent

    def _send_backup(self, straggler: Running, slot: NodeSlot) -> bool:
        from .master import Flight

        job = self.pending[straggler.job.id]
        exec_id = self.store.next_exec_ids(1)[0]
        sent_at = utcnow()
        attempt = job.attempts + 1
        flight = Flight(job.id, slot.load.id, attempt, exec_id, sent_at, job.run_id, backup=True)
        self.store.record_dispatches(
            [
                {
                    "id": exec_id,
                    "run_id": job.run_id,
                    "node_id": slot.load.id,
                    "epoch": self.epoch,
                    "sent_at": sent_at,
                    "items": json.dumps([[exec_id, job.id, attempt]]),
                }
            ]
        )
        self.dispatch_left[exec_id] = 1
        slot.inflight[exec_id] = flight
        self.copies[job.id] = {straggler.exec_id: straggler.node_id, exec_id: slot.load.id}
        try:
            slot.link.send(self.epoch, ((exec_id, job.family, job.payload),))
        except AgentUnavailable:
            self._node_down(slot)  # type: ignore[attr-defined]
            return False
        log.info(
            "job %s straggles on node %s (%.2fs, expected %.2fs): backup on node %s",
            job.key,
            straggler.node_id,
            straggler.elapsed,
            straggler.expected,
            slot.load.id,
        )
        return True

    def _flush_cancels(self) -> None:
        cancels, self.to_cancel = self.to_cancel, {}
        for node_id, exec_ids in cancels.items():
            slot = self.nodes.get(node_id)
            if slot is not None and slot.usable:
                self._cancel(slot, exec_ids)

    # -- after a run: node speeds and the lower bound --------------------------------------------

    def _lower_bound(self, active: ActiveRun) -> float | None:
        """Learn node speeds again, then LB = max(work / speed, longest / fastest) of the run."""
        speeds = self.knowledge.learn_speeds()
        for node_id, speed in speeds.items():
            slot = self.nodes.get(node_id)
            if slot is not None and abs(slot.load.speed - speed) > 1e-9:
                slot.load.speed = speed
                self.store.update_node(node_id, speed=speed)
        works = self.run_works.pop(active.run.id, {})
        self.drift.clear()
        self.node_failures.clear()
        self.retry_on.clear()
        nodes = {
            s.load.id: (self.knowledge.speed(s.load.id), s.load.slots)
            for s in self.nodes.values()
            if not s.removed and (s.usable or any(n == s.load.id for n, _d in works.values()))
        }
        return balance.lower_bound([d * self.knowledge.speed(n) for n, d in works.values()], nodes)
