"""Balancing: the loop's steps that move jobs between nodes, as one component.

:class:`Balancer` owns its state (below, each container's shape in a comment) and
changes jobs only through the job book; it reaches agents through :class:`Nodes`
and commits through the :class:`Ledger`. Its steps, called by the loop:

    balance            an idle agent takes unstarted jobs from the one that ends last
    check_timeouts     take jobs back from an agent past its family's timeout
    run_backups        near a cycle's end: backup copies of stragglers (idempotent families)
    poll_cap           how long the loop may pause while jobs run

and it is told of every result (:meth:`Balancer.result`). Homes and trial moves
are decided by its :class:`~jodl.master.trials.TrialMoves`. The cost model and the
decisions (pure functions) are in :mod:`jodl.master.rules`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import time
from functools import partial
from itertools import islice

from ..agent.client import AgentLink
from ..agent.codec import encode_traces
from ..log.models import ExecState, utcnow
from ..log.records import PendingJob, Sent
from ..obs import tracing
from ..placement import BalanceView, JobInfo, Move, NodeLoad, Placement
from ..placement import Waiting as WaitingView
from . import rules
from .book import Stage
from .nodes import Nodes, NodeSlot
from .outcomes import Outcomes
from .parts import PartOf, Parts
from .records import execution_row, job_info
from .rules import (
    LEAD_CAP,
    LEAD_STEPS,
    POLL_FLOOR,
    POLL_SHARE,
    STEAL_WINDOW,
    STEP_WEIGHT,
    NodeQueue,
    Running,
    Steal,
    Stealable,
)
from .trials import TrialMoves

log = logging.getLogger("jodl.master")


def _unix(when: dt.datetime) -> float:
    return when.replace(tzinfo=dt.UTC).timestamp()


class Balancer(PartOf):
    """The balancing steps of the master's loop (see the module's docstring)."""

    def __init__(self, parts: Parts, nodes: Nodes, outcomes: Outcomes) -> None:
        super().__init__(parts)
        self.store = parts.store
        self.book = parts.book
        self.nodes = nodes
        self.ledger = parts.ledger
        self.outcomes = outcomes
        self.families = parts.families
        self.knowledge = parts.knowledge
        self.runs = parts.runs
        self.rng = random.Random()
        #: node -> unix time of the last result it reported.
        self.last_finish: dict[int, float] = {}
        #: node -> [actual seconds, expected seconds] of its results in this run.
        self.drift: dict[int, list[float]] = {}
        #: Moving mean of the loop's step time (seconds) and when the last step balanced.
        self.step_time = 0.0
        self._last_step = 0.0
        #: Nodes the last balance step gave jobs to (the loop sends them at once).
        self.fed: set[int] = set()
        self.trials = TrialMoves(parts, nodes, self.rng)
        # Told of each result, and of nodes given up on (their homes are freed).
        parts.watcher = self
        parts.node_gone = self.trials.node_gone

    # -- told by the loop --------------------------------------------------------------------

    def results(
        self, slot: NodeSlot, done: list[tuple[PendingJob, float, tuple[int, float] | None]]
    ) -> None:
        """Results of ``slot`` are about to be committed: learn the node's drift from
        them (what the jobs placed there took against what they were expected to)."""
        node_id = slot.id
        slot.late = False
        self.last_finish[node_id] = time.time()
        actual = expected = 0.0
        for _job, duration, placed in done:
            if placed is not None and placed[0] == node_id:
                actual += duration
                expected += placed[1]
        if expected or actual:
            acc = self.drift.setdefault(node_id, [0.0, 0.0])
            acc[0] += actual
            acc[1] += expected
        self.trials.note(node_id, done)

    def end_of_run(self) -> None:
        self.drift.clear()
        self.book.end_of_run()

    # -- what the steps share ------------------------------------------------------------------

    def _drift(self, node_id: int) -> float:
        """How much longer than expected this node's jobs took in this run (1.0: as expected)."""
        actual, expected = self.drift.get(node_id, (0.0, 0.0))
        return actual / expected if actual > 0 and expected > 0 else 1.0

    def _running(self, slot: NodeSlot, now: float) -> list[tuple[int, Sent, float]]:
        """(exec_id, sent, started) of the executions the agent is most likely running.

        The agent runs its queue in order, so these are the oldest ones, one per
        slot; one started when it was sent or when the node last finished a job.
        """
        out = []
        last = self.last_finish.get(slot.id, 0.0)
        flights = self.book.flights[slot.id]
        for exec_id, sent in islice(flights.items(), max(1, slot.load.slots)):
            out.append((exec_id, sent, min(now, max(_unix(sent.sent_at), last))))
        return out

    def _expected(self, job: JobInfo, node: NodeLoad) -> float:
        return float(self.knowledge.expected(job, node))

    def poll_cap(self) -> float:
        """Longest pause of the loop now: :data:`POLL_SHARE` of the shortest running job.

        A job's length is its expected duration, or how long it has run already
        when that is longer (a job far past its estimate is not polled in a tight
        loop).
        """
        shortest = float("inf")
        now = time.time()
        for slot in self.nodes:
            if self.book.flights[slot.id] and slot.usable:
                for _exec_id, sent, started in self._running(slot, now):
                    placed = self.book.placed.get(sent.job_id)
                    if placed is not None:
                        shortest = min(shortest, max(placed[1], now - started))
        return max(POLL_FLOOR, POLL_SHARE * shortest)

    # -- balance -------------------------------------------------------------------------------

    def balance(self) -> int:
        """An agent about to run dry takes unstarted jobs from the agent expected to
        finish last.

        About to run dry: nothing waits for it here and what its agent holds is expected
        to end within the time a steal takes to reach it (:meth:`lead`), so a node
        with one short job left steals before it idles rather than after (the steal's
        round trips and a loop step ahead of its end, not behind it). Jobs not sent
        yet move at once; jobs on the agent are asked back (protocol f) and move only
        if the agent confirms they had not started. A move is made only if the job ends
        earlier on the thief by more than the round trip plus a margin (the steal
        inequality of :mod:`jodl.master.rules`). The nodes given jobs are :attr:`fed`:
        the loop sends them what they took in the same step, not the next one.
        """
        book = self.book
        now = time.time()
        self._clock(now)
        self.fed = set()
        usable = self.nodes.usable()
        if len(usable) < 2:
            return 0
        lead = self.lead()
        finish: dict[int, tuple[float, float, float]] = {}
        idle = []
        for s in usable:
            if book.queues[s.id] or s.late:
                continue
            finish[s.id] = ends = self._finish(s, now)
            if len(book.flights[s.id]) < max(1, s.load.slots) or ends[2] <= lead:
                idle.append(s)
        if not idle:
            return 0
        for s in usable:
            if s.id not in finish:
                finish[s.id] = self._finish(s, now)
        queues = {s.id: self._queue(s, *finish[s.id][:2], s in idle) for s in usable}
        # A thief may take the families of the jobs waiting, and only those are checked:
        # checking every family its agent serves would load each one's class (a version
        # check), tens of milliseconds in the step where a node first runs dry.
        waiting = {w.job.family for q in queues.values() for w in q.waiting}
        for slot in idle:
            queues[slot.id].families = frozenset(
                f
                for f in waiting
                if f in slot.families and self.nodes.allowed(f, slot) and not self.families.kept(f)
            )
        steals = rules.plan_steals(
            list(queues.values()),
            self._expected,
            lambda j: self.families.tuned(j.family).steal_margin,
        )
        moved = self._carry_out(steals)
        moved += self._strategy_moves(queues, idle)
        self.fed = {s.id for s in idle if book.queues[s.id]}
        return moved

    def _clock(self, now: float) -> None:
        """Time the loop's steps (this step is called once in each)."""
        if self._last_step:
            took = min(now - self._last_step, LEAD_CAP)
            self.step_time = (1 - STEP_WEIGHT) * self.step_time + STEP_WEIGHT * took
        self._last_step = now

    def lead(self) -> float:
        """Seconds before it runs dry a node steals: :data:`LEAD_STEPS` loop steps (its
        end is seen at a step's collect; what it steals is sent at the end of the step
        that stole it); the round trips are counted in the steal inequality."""
        return LEAD_STEPS * self.step_time

    def _finish(self, slot: NodeSlot, now: float) -> tuple[float, float, float]:
        """(seconds until the node is expected to have ended all it holds, its drift,
        the same but infinite while a job runs past its expected end there: how soon
        it runs dry is unknown then)."""
        drift = self._drift(slot.id)
        done_part = 0.0
        overdue = False
        for _exec_id, sent, started in self._running(slot, now):
            placed = self.book.placed.get(sent.job_id)
            if placed is not None and placed[0] == slot.id:
                done_part += min(now - started, placed[1] * drift)
                overdue = overdue or now - started > placed[1] * drift
        finish = max(0.0, slot.load.queued_work * drift - done_part) / max(1, slot.load.slots)
        return finish, drift, float("inf") if overdue else finish

    def _queue(self, slot: NodeSlot, finish: float, drift: float, idle: bool) -> NodeQueue:
        book = self.book
        slots = max(1, slot.load.slots)
        waiting: list[Stealable] = []
        queue = book.queues[slot.id]
        if len(queue) < STEAL_WINDOW:
            for exec_id, sent in islice(book.flights[slot.id].items(), slots, None):
                job = book.jobs.get(sent.job_id)
                placed = book.placed.get(sent.job_id)
                if job is None or exec_id in book.backups or job.id in book.copies or not placed:
                    continue
                waiting.append(Stealable(job_info(job), placed[1] * drift, True, exec_id))
        for job_id in list(islice(reversed(queue), STEAL_WINDOW))[::-1]:
            job = book.jobs.get(job_id)
            placed = book.placed.get(job_id)
            if job is not None and placed is not None:
                waiting.append(Stealable(job_info(job), placed[1] * drift))
        return NodeQueue(slot.load, finish, waiting, slot.link.rtt, idle)

    def _carry_out(self, steals: list[Steal]) -> int:
        """Move the planned steals: jobs still here at once; jobs on agents are asked
        back from every victim at once (one round trip for the step, not one per
        victim: at a cycle's end many nodes steal in the same step, and asked one
        after the other the step took a round trip per victim while every agent
        waited for its next send)."""
        moved = 0
        by_source: dict[int, list[Steal]] = {}
        for st in steals:
            by_source.setdefault(st.source, []).append(st)
        asks: dict[int, dict[int, int]] = {}
        for source_id, group in by_source.items():
            targets = {}
            for st in group:
                if st.exec_id is None:
                    target = self.nodes[st.target].load
                    job = job_info(self.book.jobs[st.job_id])
                    targets[st.job_id] = (st.target, self._expected(job, target))
            moved += len(self.book.move_tail(source_id, targets))
            asked = {st.exec_id: st.target for st in group if st.exec_id is not None}
            if asked:
                asks[source_id] = asked
        if asks:
            back = self.take_back_each({n: list(a) for n, a in asks.items()})
            for source_id, given in back.items():
                for job_id, exec_id in given:
                    target = self.nodes[asks[source_id][exec_id]].load
                    expected = self._expected(job_info(self.book.jobs[job_id]), target)
                    self.book.place(job_id, target.id, expected, front=True)
                    moved += 1
        return moved

    def take_back(self, slot: NodeSlot, exec_ids: list[int]) -> list[tuple[int, int]]:
        """Ask the agent for unstarted executions back (f); log the ones it returns.

        Returns (job, execution) of the jobs now waiting (a job whose other copy
        still runs stays in flight).
        """
        return self.take_back_each({slot.id: exec_ids}).get(slot.id, [])

    def take_back_each(self, asks: dict[int, list[int]]) -> dict[int, list[tuple[int, int]]]:
        """:meth:`take_back` from several agents, the calls made at once; by node."""
        epoch = self.epoch
        calls = {
            node_id: partial(self._timed_take_back, self.nodes[node_id], exec_ids)
            for node_id, exec_ids in asks.items()
        }
        rows = []
        out: dict[int, list[tuple[int, int]]] = {}
        for node_id, given in self.nodes.call_each(epoch, calls).items():
            if given is None:
                continue
            back = out[node_id] = []
            for exec_id in given:
                closed = self.book.take_back(node_id, exec_id)
                if closed is None:
                    continue
                rows.append(
                    execution_row(
                        exec_id, closed.sent, ExecState.TAKEN_BACK, epoch, backup=closed.backup
                    )
                )
                if self.book.stage.get(closed.sent.job_id) is Stage.WAITING:
                    back.append((closed.sent.job_id, exec_id))
        self.ledger.commit(rows)
        return out

    def _timed_take_back(self, slot: NodeSlot, exec_ids: list[int]) -> tuple[int, ...]:
        """The agent's take_back call (on a call thread); its round trip measured."""
        started = time.perf_counter()
        given = slot.link.take_back(self.epoch, 0, exec_ids)
        slot.link.rtt = 0.8 * slot.link.rtt + 0.2 * (time.perf_counter() - started)
        return given

    def _strategy_moves(self, queues: dict[int, NodeQueue], idle: list[NodeSlot]) -> int:
        """Moves the families' strategies propose (their :meth:`Placement.moves` hook)."""
        strategies = self.families.strategies.values()
        hooks = [s for s in strategies if type(s).moves is not Placement.moves]
        if not hooks:
            return 0
        waiting = [
            WaitingView(w.job, node_id, w.expected, w.sent)
            for node_id, q in queues.items()
            for w in q.waiting
            if not w.sent and not self.families.kept(w.job.family)
        ]
        view = BalanceView(
            [q.node for q in queues.values()],
            waiting,
            self.knowledge,
            frozenset(s.id for s in idle),
            {n: q.rtt for n, q in queues.items()},
        )
        moved = 0
        for hook in hooks:
            for move in hook.moves(view):
                moved += self._apply_move(move)
        return moved

    def _apply_move(self, move: Move) -> int:
        target = self.nodes.get(move.node_id)
        job = self.book.jobs.get(move.job_id)
        if target is None or job is None or not self.nodes.allowed(job.family, target):
            return 0
        expected = self._expected(job_info(job), target.load)
        return int(self.book.move(move.job_id, target.id, expected))

    # -- check_timeouts ------------------------------------------------------------------------

    def check_timeouts(self) -> int:
        """Take jobs back from an agent past its family's timeout.

        An execution out longer than its family's ``timeout`` makes its agent late:
        everything it has not started is taken back and placed elsewhere, the late
        execution is cancelled and counts as a failed attempt there, and the node
        gets no new jobs until it has nothing running any more.
        """
        if not any(t.timeout for t in self.families.tuning.values()):
            return 0
        self._release_late()
        now = time.time()
        handled = 0
        book = self.book
        for slot in [s for s in self.nodes if s.usable and book.flights[s.id]]:
            late: dict[int, float] = {}
            for exec_id, sent, started in self._running(slot, now):
                job = book.jobs.get(sent.job_id)
                if job is None or not self._may_copy(job.family, slot):
                    # Cancelling only drops the result: the job runs on there. A family
                    # whose class says a second run does harm waits for its outcome.
                    continue
                timeout = self.families.tuned(job.family).timeout
                if rules.overdue({exec_id: started}, now, timeout):
                    late[exec_id] = now - started
            if not late:
                continue
            slot.late = True
            log.warning("node %s is past its timeout: taking its jobs back", slot.link.address)
            rest = [e for e in book.flights[slot.id] if e not in late and e not in book.backups]
            if rest:
                self.take_back(slot, rest)
            if not slot.usable:
                continue  # lost while taking back: its jobs wait again already
            book.give_back(slot.id)
            self.nodes.cancel(slot, self.epoch, list(late))
            failed = tuple(
                (e, took, now, f"timed out after {took:.1f}s", True)
                for e, took in late.items()
                if e in book.flights[slot.id]
            )
            handled += self.outcomes.report(slot, (), failed)
        return handled

    def _release_late(self) -> None:
        """A late node that runs nothing any more may take jobs again."""
        for slot in self.nodes:
            if not slot.late or not slot.usable:
                continue
            remaining = self.nodes.call(slot, self.epoch, AgentLink.remaining, self.epoch)
            if remaining is None:
                continue
            queued, running, _done, _failed = remaining
            if not queued and not running:
                slot.late = False

    # -- run_backups ---------------------------------------------------------------------------

    def _may_copy(self, family: str, slot: NodeSlot) -> bool:
        """Whether ``family``'s jobs may run twice on ``slot``: its class on that agent
        declares it (the one source of truth), and no operator turned it off."""
        return family in slot.idempotent and self.families.tuned(family).idempotent is not False

    def run_backups(self) -> int:
        """Near the end of a cycle, run backup copies of stragglers on idle nodes.

        Only for idempotent families (running twice does no harm: as the family class
        on the agents declares, :attr:`jodl.family.Family.idempotent`, unless an
        operator turned it off with ``jodl family set --idempotent false``), and only
        once nothing of the cycle waits to be sent. The first
        committed result wins; the other copy is cancelled.
        """
        book = self.book
        families = {
            a.family.name
            for a in self.runs.values()
            if self.families.tuned(a.family.name).idempotent is not False
            and not self.families.kept(a.family.name)
        }
        if not families or book.has_waiting() or any(book.queues[s.id] for s in self.nodes):
            return 0
        now = time.time()
        running: list[Running] = []
        for slot in self.nodes.usable():
            for exec_id, sent, started in self._running(slot, now):
                job = book.jobs.get(sent.job_id)
                if job is None or job.family not in families or job.id in book.copies:
                    continue
                if not self._may_copy(job.family, slot):
                    continue
                info = job_info(job)
                expected = self._expected(info, slot.load)
                running.append(Running(exec_id, info, slot.id, now - started, expected))
        if not running:
            return 0
        picks: list[tuple[Running, NodeSlot]] = []
        for fam in families:
            idle = [
                s.load
                for s in self.nodes
                if self.nodes.allowed(fam, s)
                and not book.flights[s.id]
                and not book.queues[s.id]
                and self._may_copy(fam, s)
            ]
            mine = [r for r in running if r.job.family == fam]
            factor = self.families.tuned(fam).backup_factor
            rtt = max((s.link.rtt for s in self.nodes.usable()), default=0.0)
            for straggler, node in rules.pick_backups(mine, idle, self._expected, factor, rtt):
                picks.append((straggler, self.nodes[node.id]))
        return self._send_backups(picks)

    def _send_backups(self, picks: list[tuple[Running, NodeSlot]]) -> int:
        """Backup copies of the stragglers of ``picks`` on their idle nodes: logged in one
        write (before any is sent), each node's copies in one call, every node's at once;
        how many reached their agent. One by one, the backups of a cycle's end on 500
        agents made one loop step of 0.44 s (``bench/farm.py``)."""
        if not picks:
            return 0
        ids = self.store.next_exec_ids(len(picks))
        sent_at = utcnow()
        rows: list[dict[str, object]] = []
        copies: list[tuple[Sent, Running]] = []
        for (straggler, slot), exec_id in zip(picks, ids, strict=True):
            job = self.book.jobs[straggler.job.id]
            attempt = job.attempts + 1
            sent = Sent(exec_id, job.id, slot.id, attempt, exec_id, sent_at, job.run_id)
            copies.append((sent, straggler))
            rows.append(
                {
                    "id": exec_id,
                    "run_id": job.run_id,
                    "node_id": slot.id,
                    "epoch": self.epoch,
                    "sent_at": sent_at,
                    "items": json.dumps([[exec_id, job.id, attempt]]),
                }
            )
        self.store.record_dispatches(rows)
        wires: dict[int, list[tuple[int, str, str]]] = {}
        traced: dict[int, list[tracing.SentJob]] = {}
        for sent, straggler in copies:
            self.book.add_backup(sent, straggler.exec_id, straggler.node_id)
            job = self.book.jobs[sent.job_id]
            wires.setdefault(sent.node_id, []).append((sent.exec_id, job.family, job.payload))
            if tracing.state.on:  # rare calls: their dispatch spans made here
                traced.setdefault(sent.node_id, []).append(
                    tracing.SentJob(sent.exec_id, job.id, job.family, job.key, sent.attempt)
                )
        calls = {}
        for node_id, wire in wires.items():
            slot = self.nodes[node_id]
            extra = (encode_traces(tracing.carriers(traced[node_id])),) if slot.traces else ()
            calls[node_id] = partial(slot.link.send, self.epoch, tuple(wire), *extra)
        started = time.time_ns()
        replies = self.nodes.call_each(self.epoch, calls)
        for node_id, jobs in traced.items():
            failed = None if replies.get(node_id) is not None else "the send failed"
            tracing.dispatched(self.nodes[node_id].link.address, jobs, started, failed)
        count = 0
        for sent, straggler in copies:
            if replies.get(sent.node_id) is None:
                continue
            count += 1
            log.info(
                "job %s straggles on node %s (%.2fs, expected %.2fs): backup on node %s",
                self.book.jobs[sent.job_id].key,
                straggler.node_id,
                straggler.elapsed,
                straggler.expected,
                sent.node_id,
            )
        return count
