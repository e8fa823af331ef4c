"""Placing waiting jobs on nodes, and sending queued jobs to the agents.

``assign`` asks each family's placement strategy where its waiting jobs go (a job
that failed on a node fewer than the family's K times goes back there first);
``send`` takes from each node's queue what keeps its agent busy for
:data:`~jodl.master.rules.QUEUE_AHEAD` seconds (in one step at most a share of
:data:`~jodl.master.rules.STEP_SEND`), logs the executions (write-ahead: committed
before any agent sees them), then makes one send call per agent.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from functools import partial
from itertools import islice
from typing import Any

from .. import failpoint
from ..agent.client import AgentLink, WireJob
from ..agent.codec import encode_traces
from ..agent.replies import DoneRow, FailedRow, Refused
from ..exceptions import AgentUnavailable, Fenced
from ..log.models import utcnow
from ..log.records import PendingJob, Sent
from ..obs import tracing
from ..obs.metrics import count_sent
from ..placement import JobInfo, NodeLoad
from .calls import Outcome
from .nodes import Nodes, NodeSlot
from .outcomes import COLLECT_LIMIT, Outcomes
from .parts import PartOf, Parts
from .records import job_info
from .rules import FEW_AHEAD, PLACE_STEP, QUEUE_AHEAD, STEP_SEND


@dataclass
class Sending:
    """Batches logged by :meth:`Dispatcher.prepare`, to be sent (one per agent)."""

    epoch: int
    total: int
    #: node -> its batch as sent.
    wires: dict[int, list[WireJob]]
    sents: dict[int, list[Sent]]
    #: node -> the trace contexts of its batch (agents that read them, traces on).
    carriers: dict[int, str]
    traced: dict[int, list[tracing.SentJob]] | None
    #: The batches replace executions given up on (failpoints in tests).
    replacing: bool
    links: dict[int, AgentLink]
    #: When the calls went out (ns, for the traces' dispatch spans).
    started: int = field(default_factory=time.time_ns)

    def call(self, node_id: int) -> Callable[[], tuple[Refused, ...]]:
        """The ``send`` call of ``node_id``'s batch."""
        link, wire = self.links[node_id], self.wires[node_id]
        return partial(link.send, self.epoch, wire, self.carriers.get(node_id, ""))

    def with_outcomes(
        self, node_id: int, acks: list[int]
    ) -> Callable[[], tuple[tuple[Refused, ...], list[DoneRow], list[FailedRow]]]:
        """The ``exchange`` call of ``node_id``: its batch sent, then its outcomes taken."""
        link, wire = self.links[node_id], self.wires[node_id]
        carriers = self.carriers.get(node_id, "")
        return partial(link.exchange, self.epoch, wire, acks, COLLECT_LIMIT, carriers)


class Dispatcher(PartOf):
    """The assign and send steps of the loop."""

    def __init__(self, parts: Parts, nodes: Nodes, outcomes: Outcomes) -> None:
        super().__init__(parts)
        self.store = parts.store
        self.book = parts.book
        self.nodes = nodes
        self.families = parts.families
        self.knowledge = parts.knowledge
        self.outcomes = outcomes
        self.runs = parts.runs
        self.batch_size = parts.settings.batch_size
        parts.first_batch = self.first_batch

    # -- assign ------------------------------------------------------------------------------

    def assign(self) -> int:
        """Place the jobs waiting for a node with their family's strategy: the oldest
        :data:`~jodl.master.rules.PLACE_STEP` in one step, the others in the next ones.

        While a run has sent nothing yet (it just opened, or a new master resumed it),
        its family's jobs are placed only until a first batch (:meth:`first_batch`)
        waits queued on its nodes, so the agents get work at once; the rest is placed
        in the first step after that batch went out, with it counted in. Placing
        100,000 jobs takes most of a second, all of it before the first send otherwise.
        The cost: a run's first batch is its oldest due jobs, not the strategy's first
        choices among all of them.
        """
        if not self.book.has_waiting():
            return 0
        by_family: dict[str, list[PendingJob]] = {}
        for job in self.book.waiting_jobs(PLACE_STEP):
            by_family.setdefault(job.family, []).append(job)
        room = self._first_room(set(by_family))
        placed = 0
        for fam, jobs in by_family.items():
            loads = self.nodes.candidates(fam)
            if not loads:
                continue
            if fam in room:
                placed_now = self._place(fam, jobs[: max(0, room[fam])], loads)
                if placed_now or room[fam] <= 0:
                    placed += placed_now
                    continue
                jobs = jobs[room[fam] :]  # the strategy left the first ones: try all
            placed += self._place(fam, jobs, loads)
        return placed

    def _place(self, fam: str, jobs: list[PendingJob], loads: list[NodeLoad]) -> int:
        infos = self._retry_in_place([job_info(job) for job in jobs])  # failed there < K times

        def candidates(_job: JobInfo) -> list[NodeLoad]:
            return loads  # the same list for each job: placement indexes it once

        placed = self.families.strategies[fam].placements(infos, candidates, self.knowledge)
        for info, load, expected in placed:
            # placement already counted the job into load.queued_*, by ``expected``
            self.book.place(info.id, load.id, expected, counted=True)
        return len(placed) + len(jobs) - len(infos)  # with those put back where they failed

    def resuming(self) -> bool:
        """A run resumed from the log has sent nothing yet (its first step collects first)."""
        return any(a.resumed and a.first_send is None for a in self.runs.values())

    def first_batch(self) -> int:
        """How many jobs of a run are placed before its first send: one send per agent."""
        return self.batch_size * max(1, len(self.nodes.usable()))

    def _first_room(self, families: set[str]) -> dict[str, int]:
        """Of ``families``, those with a run that has sent nothing yet -> how many more
        of their jobs to place now (a first batch less those queued on nodes)."""
        fresh = {a.family.name for a in self.runs.values() if a.first_send is None} & families
        if not fresh:
            return {}
        room = dict.fromkeys(fresh, self.first_batch())
        jobs = self.book.jobs
        for queue in self.book.queues.values():
            for job_id in queue:
                fam = jobs[job_id].family
                if fam in room:
                    room[fam] -= 1
        return room

    def _retry_in_place(self, jobs: list[JobInfo]) -> list[JobInfo]:
        """Put jobs that failed on a node fewer than K times back on it; return the others."""
        if not self.book.retry_on:
            return jobs
        rest = []
        for info in jobs:
            slot = self.nodes.get(self.book.take_retry_node(info.id))
            if slot is None or not self.nodes.allowed(info.family, slot):
                rest.append(info)
                continue
            self.book.place(info.id, slot.id, float(self.knowledge.expected(info, slot.load)))
        return rest

    # -- send --------------------------------------------------------------------------------

    def send(self, only: Collection[int] | None = None) -> int:
        """Send queued jobs, up to what keeps each agent busy and a share of
        :data:`STEP_SEND` each; log the batches first. One ``send`` call per agent.

        ``only``: to these nodes alone (the thieves of a balance step, sent what they
        stole in the step that stole it)."""
        sending = self.prepare(only)
        if sending is None:
            return 0
        calls = {node_id: sending.call(node_id) for node_id in sending.wires}
        self.deliver(sending, self.nodes.calls.each(calls))
        return sending.total

    def prepare(self, only: Collection[int] | None = None) -> Sending | None:
        """Pick the jobs to send and log them (write-ahead); None when there are none.
        The calls that send them are the caller's: :meth:`send`, or the loop's
        ``exchange`` with agents it also collects from; then :meth:`deliver`.
        ``only``: to these nodes alone."""
        book = self.book
        batches: dict[int, list[int]] = {}
        total = 0
        ready = [
            slot
            for slot in self.nodes
            if slot.usable and book.queues[slot.id] and (only is None or slot.id in only)
        ]
        share = max(1, STEP_SEND // max(1, len(ready)))
        for slot in ready:
            queue = book.queues[slot.id]
            take = min(self._room(slot), len(queue), self.batch_size, share)
            if take <= 0:
                continue
            batch = book.pick(slot.id, take, self.families.caps.get(slot.id))
            if batch:
                batches[slot.id] = batch
                total += len(batch)
        if not total:
            return None
        ids = iter(self.store.next_exec_ids(total))
        sent_at = utcnow()
        dispatches: list[dict[str, Any]] = []
        wires: dict[int, list[tuple[int, str, str]]] = {}
        sents: dict[int, list[Sent]] = {}
        jobs = book.jobs
        for node_id, job_ids in batches.items():
            # One dispatch per run per node: a batch may mix runs and on-demand jobs.
            per_run: dict[int | None, list[Sent]] = {}
            wire = wires[node_id] = []
            for job_id in job_ids:
                job = jobs[job_id]
                exec_id = next(ids)
                group = per_run.setdefault(job.run_id, [])
                dispatch_id = group[0].exec_id if group else exec_id
                attempt = job.attempts + 1
                group.append(
                    Sent(exec_id, job_id, node_id, attempt, dispatch_id, sent_at, job.run_id)
                )
                wire.append((exec_id, job.family, job.payload))
            for run_id, group in per_run.items():
                dispatches.append(
                    {
                        "id": group[0].exec_id,
                        "run_id": run_id,
                        "node_id": node_id,
                        "epoch": self.epoch,
                        "sent_at": sent_at,
                        "items": json.dumps([[s.exec_id, s.job_id, s.attempt] for s in group]),
                    }
                )
            sents[node_id] = [s for group in per_run.values() for s in group]
        failpoint.hit("before_send")
        count_sent(wires.values())
        replacing = self.nodes.ledger.settle_giveups()  # what these replace is closed first
        self.store.record_dispatches(dispatches)  # write-ahead: committed before agents see jobs
        failpoint.hit("after_log")
        if replacing:
            failpoint.hit("replacements_logged")
        traced = self._traced(sents) if tracing.state.on else None  # node -> its jobs
        carriers: dict[int, str] = {}
        for node_id in wires:
            book.send(node_id, sents[node_id])
            if traced is not None and self.nodes[node_id].traces:
                carriers[node_id] = encode_traces(tracing.carriers(traced[node_id]))
        links = {node_id: self.nodes[node_id].link for node_id in wires}
        return Sending(self.epoch, total, wires, sents, carriers, traced, replacing, links)

    def deliver(self, sending: Sending, replies: Mapping[int, Outcome[Any]]) -> None:
        """Apply the agents' replies to :meth:`prepare`'s batches (one per agent, sent
        all at once: a frozen agent delays the others by nothing): refused jobs fail,
        an agent that did not answer is suspect."""
        now = time.perf_counter()
        traced = sending.traced
        for node_id, reply in replies.items():
            slot = self.nodes[node_id]
            try:
                refused = reply.get()
            except Fenced:
                raise  # a newer master took over: stop
            except AgentUnavailable as exc:
                if traced is not None:
                    tracing.dispatched(
                        slot.link.address, traced[node_id], sending.started, str(exc)
                    )
                self.nodes.down(slot, self.epoch)  # suspect: its jobs stay for now
                continue
            if traced is not None:
                tracing.dispatched(slot.link.address, traced[node_id], sending.started)
            for sent in sending.sents[node_id]:
                active = self.runs.get(sent.run_id) if sent.run_id is not None else None
                if active is not None and active.first_send is None:
                    active.first_send = now
            if refused:
                self.outcomes.refused(slot, refused)
        failpoint.hit("after_send")
        if sending.replacing:
            failpoint.hit("replacements_sent")

    def _traced(self, sents: dict[int, list[Sent]]) -> dict[int, list[tracing.SentJob]]:
        """While traces are on: per node, its jobs as their dispatch spans describe them."""
        jobs = self.book.jobs
        rows = {
            node_id: [
                tracing.SentJob(
                    s.exec_id, s.job_id, jobs[s.job_id].family, jobs[s.job_id].key, s.attempt
                )
                for s in group
            ]
            for node_id, group in sents.items()
        }
        return rows

    def _room(self, slot: NodeSlot) -> int:
        """How many more jobs to send now: enough to keep the slots busy for QUEUE_AHEAD.

        Sized by the durations this node actually reported (not by placement's
        guesses), so no-op jobs go in large batches and long jobs stay stealable;
        and by the agent's async slots for families that run on its event loop. When
        that makes only a few (:data:`FEW_AHEAD`: the node's recent jobs were long)
        and the next ones are short, by their expected work instead: a node whose
        queue mixes long and short jobs waited a step for its next send after each
        long one (hard case of bench/makespan.py: 0.016-0.02 s of capacity a cycle).
        """
        slots = max(1, slot.load.slots)
        queue = self.book.queues[slot.id]
        if queue and slot.async_slots:
            head = self.book.jobs.get(queue[0])
            if head is not None and head.family in slot.async_families:
                slots = slot.async_slots  # coroutines on the agent's loop, not threads
        if slot.recent_duration is None:
            want = 2 * slots
        else:
            want = max(2 * slots, int(slots * QUEUE_AHEAD / max(1e-6, slot.recent_duration)))
        flights = self.book.flights[slot.id]
        room = min(want, self.batch_size) - len(flights)
        if want <= FEW_AHEAD and queue:
            # A few jobs ahead, sized by long ones just reported: if the next ones are
            # short, that is far less than QUEUE_AHEAD of work, and the agent waits for
            # the next step. Enough of them go to hold that much, by their expected work.
            placed = self.book.placed
            need = slots * QUEUE_AHEAD - sum(
                placed[s.job_id][1] for s in flights.values() if s.job_id in placed
            )
            count = 0
            for job_id in islice(queue, self.batch_size):
                if need <= 0:
                    break
                need -= placed[job_id][1]
                count += 1
            room = max(room, min(count, self.batch_size - len(flights)))
        return room
