"""The built-in placement strategies (see :mod:`jodl.placement.interface` for the interface).

``earliest_finish`` (the default)
    Longest known jobs first (LPT); each on the node where it is expected to
    end first, counting the work already queued there and the job's learned
    duration on that node. A job stays on its home node when that costs at
    most ``stickiness`` times its own duration, judged against what the batch
    will queue there: the jobs of the batch at home on a node are counted on it
    before any is placed, so a batch of jobs whose homes are balanced stays
    home instead of drifting on the order in which the queues grow. A trial
    move not yet tried is always made. A node's jobs shorter than
    ``spread_below`` are spread over its queue instead of all coming last.
``least_loaded``
    The node with the fewest queued jobs per slot (durations ignored).
``round_robin``
    Nodes in turn.
``affinity``
    Rendezvous (highest random weight) hashing of a part of the job's key
    (by default the host of a URL key): similar jobs go to the same node, and
    adding or removing one of n nodes moves only about 1/n of the keys. Its jobs
    stay there (no stealing, no backup copies) unless ``strict`` is false.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import re
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

from .interface import Placement, usable
from .knowledge import Knowledge
from .registry import register
from .view import JobInfo, NodeLoad

#: How much longer (in units of the job's own expected duration) a job may be
#: expected to take on its home node than on the best node and still stay home.
DEFAULT_STICKINESS = 0.5
#: Jobs expected to take less than this (seconds) on their node are spread over its
#: queue instead of all coming last (see :func:`spread_short`): the end of a cycle is
#: then made of jobs of tens of milliseconds, still short enough to share out finely.
#: Hard case of bench/makespan.py (32 agents, 10,000 lognormal jobs, seed 1), learned
#: cycles: jobs started in the last second 3,900 (median 5 ms) with all short jobs
#: last, 2,100-2,300 (median 15 ms) spread; loop steps there 40-55 against 70-100.
SPREAD_BELOW = 0.015
#: A batch of short jobs (see :meth:`EarliestFinish.order`) may hold one long one in
#: this many.
FEW_LONG = 100
#: Candidates from which a job nothing is known of is placed through a heap of them
#: (:class:`_Front`) instead of a scan: where a scan per job costs most of a first
#: placement (500 nodes: 110-140 s for 100,000 jobs). On two nodes the cycle with the
#: heap ran at 6,600 no-op jobs/s against 19,500 with the scan (bench/throughput.py),
#: so small clusters keep the scan.
HEAP_NODES = 32


@register
class EarliestFinish(Placement):
    """Earliest expected finish, longest jobs first, with learned per-node durations.

    Parameters: ``stickiness`` (default :data:`DEFAULT_STICKINESS`; 0 ignores
    homes except to break ties), ``lpt`` (default true: longest jobs first) and
    ``spread_below`` (default :data:`SPREAD_BELOW`; 0 keeps the short jobs last).
    """

    name = "earliest_finish"

    def __init__(
        self,
        stickiness: float = DEFAULT_STICKINESS,
        lpt: bool = True,
        spread_below: float = SPREAD_BELOW,
        **params: Any,
    ) -> None:
        super().__init__(stickiness=stickiness, lpt=lpt, spread_below=spread_below, **params)
        if stickiness < 0:
            raise ValueError("stickiness must be >= 0")
        self.stickiness = float(stickiness)
        self.lpt = bool(lpt)
        self.spread_below = float(spread_below)

    def order(self, jobs: list[JobInfo], knowledge: Knowledge) -> list[JobInfo]:
        """Highest priority first; within a priority, the longest expected work first.

        A batch of jobs shorter than ``spread_below`` (no-op jobs, say), but for at
        most one in :data:`FEW_LONG`, is not sorted by the short ones' durations: the
        long ones first, longest first, then the short ones by id, as the log reads
        them. What order such jobs run in changes the cycle's end by less than one of
        them takes, and sorted by durations that differ by noise, a repeat cycle of
        100,000 no-op jobs visited them in an order unrelated to their place in
        memory: the loop spent a fifth more CPU a job (taking results, placing,
        preparing sends) than in the same cycle kept in order. A few long ones are
        noise too: no-op jobs on agents of 8 slots measured 15 ms now and then (a
        thread that waited for the interpreter), and the repeat cycle of a million
        of them placed every batch by duration, its loop 45 µs of CPU a job
        against 31 in the first cycle (bench/scale.py).
        """
        if not self.lpt:
            return super().order(jobs, knowledge)
        work = knowledge.estimate_work
        below = self.spread_below
        works = {job.id: work(job) for job in jobs}
        if below > 0 and sum(w >= below for w in works.values()) * FEW_LONG <= len(jobs):
            return sorted(
                jobs,
                key=lambda j: (
                    (-j.priority, 0, -works[j.id], j.id)
                    if works[j.id] >= below
                    else (-j.priority, 1, 0.0, j.id)
                ),
            )
        return sorted(jobs, key=lambda j: (-j.priority, -works[j.id], j.id))

    #: node -> expected seconds the batch being placed will still put there (its jobs at
    #: home on the node, not placed yet); empty outside :meth:`place`.
    _reserved: dict[int, float] = {}
    #: family -> its candidates in a heap, for the batch's jobs nothing is known of
    #: (:class:`_Front`); None outside :meth:`place`.
    _fronts: dict[str, _Front] | None = None

    def place(
        self,
        jobs: list[JobInfo],
        candidates: Callable[[JobInfo], Sequence[NodeLoad]],
        knowledge: Knowledge,
    ) -> list[tuple[JobInfo, NodeLoad]]:
        """Place a batch, each job judged against the queues the batch will make."""
        return [(job, node) for job, node, _took in self._placed(jobs, candidates, knowledge)]

    def placements(
        self,
        jobs: list[JobInfo],
        candidates: Callable[[JobInfo], Sequence[NodeLoad]],
        knowledge: Knowledge,
    ) -> list[tuple[JobInfo, NodeLoad, float]]:
        """:meth:`place`, with what each job is expected to take on its node."""
        if type(self).place is not EarliestFinish.place:  # a subclass's own place()
            return super().placements(jobs, candidates, knowledge)
        return self._placed(jobs, candidates, knowledge)

    def _placed(
        self,
        jobs: list[JobInfo],
        candidates: Callable[[JobInfo], Sequence[NodeLoad]],
        knowledge: Knowledge,
    ) -> list[tuple[JobInfo, NodeLoad, float]]:
        """This class's placement of a batch (the one :meth:`place` and
        :meth:`placements` share; a subclass's ``place`` may call ``super().place``)."""
        reserved: dict[int, float] = {}
        self._reserved = reserved
        self._fronts = {}
        self._unknown = {}
        took_of = self._took_of = {}
        out: list[tuple[JobInfo, NodeLoad, float]] = []
        # A subclass's own choose() (a rule before this one, as in docs/placement.md)
        # is asked for every job; this class's rule goes straight to _pick().
        own = type(self).choose is EarliestFinish.choose
        try:
            for job in jobs:
                nodes = candidates(job)
                at = self._home_at(job, nodes)
                if at is not None:
                    # what the job takes on each candidate, for its reservation now and
                    # its choice below: asked once
                    took_on = self._took_on(job, nodes, knowledge)
                    took_of[job.id] = (nodes, took_on, at)
                    home = nodes[at]
                    reserved[home.id] = reserved.get(home.id, 0.0) + took_on[at]
            for job in self.order(jobs, knowledge):
                nodes = candidates(job)
                if not nodes:
                    continue
                if own:
                    node, took = self._pick(job, nodes, knowledge)
                else:
                    chosen = self.choose(job, nodes, knowledge)
                    if chosen is None:
                        continue
                    node, took = chosen, knowledge.expected(job, chosen)
                node.queued_jobs += 1
                node.queued_work += took
                out.append((job, node, took))
            if self.lpt and self.spread_below > 0:
                return spread_short(out, self.spread_below)
            return out
        finally:
            self._reserved = {}
            self._fronts = None
            self._index = None
            self._unknown = {}
            self._took_of = {}

    def choose(
        self, job: JobInfo, candidates: Sequence[NodeLoad], knowledge: Knowledge
    ) -> NodeLoad | None:
        return self._pick(job, candidates, knowledge)[0]

    def _pick(
        self, job: JobInfo, candidates: Sequence[NodeLoad], knowledge: Knowledge
    ) -> tuple[NodeLoad, float]:
        """The node for ``job`` and what the job is expected to take there."""
        home = job.home
        reserved = self._reserved
        asked = self._took_of.get(job.id)
        if asked is not None and asked[0] is candidates:  # by place()'s reservations
            took_on, at = asked[1], asked[2]
        else:
            if home is None:  # only such a job may be placed through a heap
                front = self._front(job, candidates, knowledge)
                if front is not None:
                    node = front.best()
                    return node, front.took[node.id]
            # every candidate's expected duration at once, shared by all that follows
            took_on = self._took_on(job, candidates, knowledge)
            at = None
            if reserved and home is not None:
                at = self._home_at(job, candidates)
        if at is not None:
            at_home = candidates[at]
            if at_home.id in reserved:  # the job is being placed now
                left = reserved[at_home.id] - took_on[at]
                reserved[at_home.id] = left if left > 0.0 else 0.0
                if self._fronts:
                    for front in self._fronts.values():
                        front.lowered(at_home)
        failed = job.failed_on
        if failed and all(node.id in failed for node in candidates):
            failed = frozenset()  # failed everywhere: any node (see usable())
        trial = job.trial_node_id
        if trial is not None and trial not in failed:
            learned = knowledge.learned(job.id, trial)
            if learned is None or learned.count == 0:
                for i, node in enumerate(candidates):
                    if node.id == trial:
                        return node, took_on[i]  # the point of a trial is to measure it there
        best: NodeLoad | None = None
        best_cost = math.inf
        best_took = home_cost = home_took = 0.0
        home_node: NodeLoad | None = None
        for node, took in zip(candidates, took_on, strict=True):
            if failed and node.id in failed:
                continue
            slots = node.slots if node.slots > 1 else 1  # NodeLoad.expected_finish(), inline
            cost = node.queued_work / slots + took
            if reserved:
                cost += reserved.get(node.id, 0.0) / slots
            if node.id == home:
                home_node, home_cost, home_took = node, cost, took
            if best is None or cost < best_cost or (cost == best_cost and _tie(node) < _tie(best)):
                best, best_cost, best_took = node, cost, took
        assert best is not None
        if home_node is not None and home_node is not best:
            if home_cost <= best_cost + self.stickiness * best_took:
                return home_node, home_took
        return best, best_took

    #: (the candidates, node id -> position) of the last job's candidates in :meth:`place`.
    _index: tuple[Sequence[NodeLoad], dict[int, int]] | None = None
    #: family -> (its candidates, what a job of it nothing is known of takes on each),
    #: within :meth:`place`.
    _unknown: dict[str, tuple[Sequence[NodeLoad], list[float]]] = {}
    #: job -> (its candidates, what it takes on each, where its home is among them), for
    #: the jobs at home on one of them, within :meth:`place`.
    _took_of: dict[int, tuple[Sequence[NodeLoad], list[float], int]] = {}

    def _took_on(
        self, job: JobInfo, candidates: Sequence[NodeLoad], knowledge: Knowledge
    ) -> list[float]:
        """:meth:`Knowledge.expected_on` of ``job``; within :meth:`place`, once per family
        and sequence of candidates for the jobs nothing is known of, whose answer is the
        same (the family's means, the nodes' speeds: neither changes while a batch is
        placed). On-demand jobs are mostly such: a batch of 1,400 on two nodes asked
        for each, a tenth of the step's placement."""
        if self._fronts is None or knowledge.knows(job.id):
            return knowledge.expected_on(job, candidates)
        known = self._unknown.get(job.family)
        if known is None or known[0] is not candidates:
            known = self._unknown[job.family] = (candidates, knowledge.expected_on(job, candidates))
        return known[1]

    def _home_at(self, job: JobInfo, nodes: Sequence[NodeLoad]) -> int | None:
        """Where the job's home is in ``nodes`` (None: no home, not a candidate, or it
        failed there); through an index of the candidates within :meth:`place`, where
        the jobs of a family share one sequence of them."""
        home = job.home
        if home is None or home in job.failed_on:
            return None
        if self._fronts is None:  # outside place(): one job, one scan
            return next((i for i, node in enumerate(nodes) if node.id == home), None)
        index = self._index
        if index is None or index[0] is not nodes:
            index = self._index = (nodes, {node.id: i for i, node in enumerate(nodes)})
        return index[1].get(home)

    def _front(
        self, job: JobInfo, candidates: Sequence[NodeLoad], knowledge: Knowledge
    ) -> _Front | None:
        """The heap that places ``job`` as the scan of :meth:`choose` would, when the
        scan's answer depends on the nodes alone: within :meth:`place`, for a job with
        no home, trial or failed node that nothing is known of, among its family's
        candidates (the same sequence for all of them)."""
        fronts = self._fronts
        if (
            fronts is None
            or job.home is not None
            or job.failed_on
            or knowledge.knows(job.id)
            or len(candidates) < HEAP_NODES
        ):
            return None
        front = fronts.get(job.family)
        if front is None or front.nodes is not candidates:
            took = self._took_on(job, candidates, knowledge)
            front = fronts[job.family] = _Front(candidates, took, self._reserved)
        return front


def _tie(node: NodeLoad) -> tuple[float, int]:
    """Between nodes where a job would end at the same time: the one with less work per
    cycle at home (for its speed and slots), then the lowest id."""
    return (node.home_work / max(1e-9, node.speed * node.slots), node.id)


def spread_short(
    placed: list[tuple[JobInfo, NodeLoad, float]], below: float
) -> list[tuple[JobInfo, NodeLoad, float]]:
    """``placed`` (job, node, expected seconds there; longest first within a priority)
    with each node's jobs shorter than ``below`` spread evenly over the time of its
    longer ones, each node's longer jobs keeping their order.

    Longest first keeps a node's last jobs short, so the end of a cycle can be shared
    out finely; but all the shortest jobs last made the master collect thousands of
    results in a cycle's last second (32 agents, 10,000 lognormal jobs: two fifths
    of them), just when it must be quick to balance, and its steps there took
    several times as long as before. Spread, the end is still made of the shortest of
    the longer jobs, and of a share of the short ones.
    """
    shorter = [took < below for _job, _node, took in placed]
    if all(shorter) or not any(shorter):  # nothing to spread (every cycle of no-op jobs)
        return placed
    by_node: dict[int, list[tuple[JobInfo, NodeLoad, float]]] = {}
    for item in placed:
        by_node.setdefault(item[1].id, []).append(item)
    out: list[tuple[JobInfo, NodeLoad, float]] = []
    for items in by_node.values():
        start = 0
        while start < len(items):  # each priority on its own, highest first
            end = start
            while end < len(items) and items[end][0].priority == items[start][0].priority:
                end += 1
            group = items[start:end]
            start = end
            longer = [item for item in group if item[2] >= below]
            short = [item for item in group if item[2] < below]
            if not longer or not short:
                out.extend(group)
                continue
            total = sum(item[2] for item in longer)
            # the k-th short job goes where (k + 1/2) / n of the longer jobs' time is
            elapsed, k = 0.0, 0
            for item in longer:
                while k < len(short) and (k + 0.5) / len(short) * total <= elapsed:
                    out.append(short[k])
                    k += 1
                out.append(item)
                elapsed += item[2]
            out.extend(short[k:])
    return out


class _Front:
    """A family's candidate nodes in a heap by the key :meth:`EarliestFinish.choose`
    minimises, for the batch's jobs nothing is known of (no home, trial or failure).

    Such a job is expected to take on a node what the family's jobs take there, the
    same for all of them, so the scan's best node is the heap's top: O(log n) a job
    instead of O(n), which on hundreds of nodes is most of a cycle's first placement.
    A key only grows as jobs land on its node (checked when it reaches the top and
    pushed down again); the one that shrinks, a reservation as a job placed at home
    leaves it, is pushed anew (:meth:`lowered`).
    """

    def __init__(
        self, nodes: Sequence[NodeLoad], took: Sequence[float], reserved: dict[int, float]
    ) -> None:
        self.nodes = nodes
        self._by_id = {node.id: node for node in nodes}
        #: node -> what a job of the family nothing is known of takes there (``took``,
        #: in the order of ``nodes``).
        self.took = dict(zip(self._by_id, took, strict=True))
        self._reserved = reserved
        # (cost, tie, node id): at least one entry per node at most its current key.
        self._heap = [self._key(node) for node in nodes]
        heapq.heapify(self._heap)

    def _key(self, node: NodeLoad) -> tuple[float, float, int]:
        # exactly the scan's arithmetic in EarliestFinish.choose, so ties resolve alike
        cost = node.expected_finish(self.took[node.id])
        if self._reserved:
            cost += self._reserved.get(node.id, 0.0) / max(1, node.slots)
        return (cost, *_tie(node))

    def best(self) -> NodeLoad:
        """The node of the smallest key now."""
        heap = self._heap
        while True:
            node = self._by_id[heap[0][2]]
            now = self._key(node)
            if now == heap[0]:
                return node
            heapq.heapreplace(heap, now)

    def lowered(self, node: NodeLoad) -> None:
        """``node``'s key shrank (its reservation did)."""
        if node.id in self._by_id:
            heapq.heappush(self._heap, self._key(node))


@register
class LeastLoaded(Placement):
    """The node with the fewest queued jobs per slot (ties: lowest id); durations ignored."""

    name = "least_loaded"

    def choose(
        self, job: JobInfo, candidates: Sequence[NodeLoad], knowledge: Knowledge
    ) -> NodeLoad | None:
        return min(usable(job, candidates), key=lambda n: (n.queued_jobs / max(1, n.slots), n.id))


@register
class RoundRobin(Placement):
    """Each job on the next node in turn (nodes ordered by id)."""

    name = "round_robin"

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._turn = 0

    def choose(
        self, job: JobInfo, candidates: Sequence[NodeLoad], knowledge: Knowledge
    ) -> NodeLoad | None:
        nodes = sorted(usable(job, candidates), key=lambda n: n.id)
        node = nodes[self._turn % len(nodes)]
        self._turn += 1
        return node


#: Where a URL starts in a job key: its scheme, then ``://``.
_URL_START = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def affinity_key(key: str, by: str = "host", pattern: str | None = None) -> str:
    """The part of a job key that decides its node.

    ``pattern``: a regular expression; its first group (or whole match) is the
    part, the whole key when it does not match. Else ``by``: ``"host"`` (the host
    of a URL, or what precedes the first ``/``) or ``"key"`` (the whole key). A URL
    after a prefix counts too (``web:https://example.org/a``: ``example.org``), so
    jobs of one host keyed for different purposes meet on one node.
    """
    if pattern:
        match = re.search(pattern, key)
        if match is None:
            return key
        return match.group(1) if match.groups() else match.group(0)
    if by == "host":
        if "://" not in key:
            return key.split("/", 1)[0].lower()
        url = _URL_START.search(key)
        host = urlsplit(key[url.start() :] if url else key).hostname
        return (host or key).lower()
    if by == "key":
        return key
    raise ValueError(f"affinity: unknown 'by' {by!r} (host or key)")


def rendezvous_score(part: str, node: NodeLoad, weighted: bool = True) -> float:
    """Highest-random-weight score of ``node`` for ``part``: the highest score wins.

    With weights (slots), a node with twice the slots wins about twice as many
    parts (logarithmic method: ``-w / ln(u)`` with ``u`` uniform from the hash).
    """
    digest = hashlib.blake2b(f"{node.address}\x00{part}".encode(), digest_size=8).digest()
    u = (int.from_bytes(digest, "big") + 0.5) / 2.0**64
    weight = float(max(1, node.slots)) if weighted else 1.0
    return -weight / math.log(u)


@register
class RendezvousAffinity(Placement):
    """Jobs whose keys share a part (by default the URL's host) go to the same node.

    Parameters: ``by`` (``"host"`` or ``"key"``), ``pattern`` (a regular
    expression picking the part instead), ``weighted`` (default true: nodes win
    in proportion to their slots), ``strict`` (default true: jobs stay on their
    node, see :attr:`Placement.keeps_nodes`; false lets idle nodes steal them).
    Nodes are identified by address, so a node that comes back gets its keys back.
    """

    name = "affinity"

    def __init__(
        self,
        by: str = "host",
        pattern: str | None = None,
        weighted: bool = True,
        strict: bool = True,
        **params: Any,
    ) -> None:
        super().__init__(by=by, pattern=pattern, weighted=weighted, strict=strict, **params)
        self.keeps_nodes = bool(strict)
        if pattern:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"affinity: bad pattern {pattern!r}: {exc}") from None
        affinity_key("x", by, pattern)  # reject a bad 'by' at once
        self.by, self.pattern, self.weighted = by, pattern, bool(weighted)

    def order(self, jobs: list[JobInfo], knowledge: Knowledge) -> list[JobInfo]:
        """Highest priority first; within a priority, the parts take turns.

        A node's queue then holds many parts at once, not one part's long run:
        jobs of one host that wait for its politeness limits do not hold up the
        other hosts' jobs behind them.
        """
        turns: dict[tuple[int, str], int] = {}
        keyed = []
        for job in jobs:
            group = (job.priority, affinity_key(job.key, self.by, self.pattern))
            turn = turns[group] = turns.get(group, -1) + 1
            keyed.append((-job.priority, turn, job))
        keyed.sort(key=lambda item: item[:2])
        return [job for _p, _t, job in keyed]

    def choose(
        self, job: JobInfo, candidates: Sequence[NodeLoad], knowledge: Knowledge
    ) -> NodeLoad | None:
        part = affinity_key(job.key, self.by, self.pattern)
        return max(
            usable(job, candidates),
            key=lambda n: (rendezvous_score(part, n, self.weighted), n.id),
        )
