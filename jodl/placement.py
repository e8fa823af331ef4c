"""Placement: which node runs a job (DESIGN §7).

A strategy is a small class: :meth:`Placement.choose` picks one node for one job
among the nodes its family may use, from a read-only view of what the master
knows: per node the expected work already queued there, its slots and learned
speed (:class:`NodeLoad`), and per job and node the learned durations
(:class:`Knowledge`). The master calls :meth:`Placement.place` once per loop step
with every job that needs a node, so a strategy sees the whole batch.

Strategies are selected per family by name (``Family.strategy``) with parameters
(``Family.strategy_params``); register your own with :func:`register` or the
entry-point group ``jodl.placements``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, ClassVar

#: Duration assumed for a job nothing is known about (seconds).
DEFAULT_DURATION = 0.5
#: Weight of the newest duration in the recent (exponentially weighted) mean.
RECENT_WEIGHT = 0.3


@dataclass(frozen=True)
class JobInfo:
    """What a strategy may know of a job."""

    id: int
    key: str
    family: str
    priority: int = 0
    permanent_node_id: int | None = None
    trial_node_id: int | None = None
    #: Nodes that failed this job in this run (avoid them).
    failed_on: frozenset[int] = frozenset()
    attempts: int = 0


@dataclass
class NodeLoad:
    """A node as placement sees it; the master keeps ``queued_*`` current."""

    id: int
    address: str
    slots: int = 1
    speed: float = 1.0
    labels: dict[str, Any] = field(default_factory=dict)
    #: Jobs sent or assigned to the node and not finished.
    queued_jobs: int = 0
    #: Expected seconds of work those jobs represent.
    queued_work: float = 0.0

    def expected_finish(self, extra: float = 0.0) -> float:
        """Seconds until the node would finish its queue plus ``extra`` seconds of work."""
        return (self.queued_work + extra) / max(1, self.slots)


@dataclass
class Learned:
    """Statistics of one job on one node (mirrors a JobOnNode row)."""

    count: int = 0
    failures: int = 0
    mean: float | None = None
    recent: float | None = None
    m2: float = 0.0
    last: float | None = None

    @property
    def spread(self) -> float:
        """Standard deviation of the durations seen (0 with fewer than two)."""
        return math.sqrt(self.m2 / (self.count - 1)) if self.count > 1 else 0.0

    def add(self, duration: float) -> None:
        """Record one successful execution (Welford mean/variance, EWMA recent)."""
        self.count += 1
        if self.mean is None:
            self.mean = duration
        delta = duration - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (duration - self.mean)
        self.recent = (
            duration
            if self.recent is None
            else (RECENT_WEIGHT * duration + (1 - RECENT_WEIGHT) * self.recent)
        )
        self.last = duration


class Knowledge:
    """Learned durations per (job, node), with the fallbacks of DESIGN §7."""

    def __init__(self, default_duration: float = DEFAULT_DURATION) -> None:
        self.default_duration = default_duration
        self.stats: dict[tuple[int, int], Learned] = {}
        self._by_job: dict[int, dict[int, Learned]] = {}
        # family -> node -> [sum, count]; node None = all nodes
        self._family: dict[str, dict[int | None, list[float]]] = {}
        self.node_speed: dict[int, float] = {}

    def learned(self, job_id: int, node_id: int) -> Learned | None:
        return self.stats.get((job_id, node_id))

    def of_job(self, job_id: int) -> dict[int, Learned]:
        return self._by_job.get(job_id, {})

    def load(self, job_id: int, node_id: int, stat: Learned, family: str) -> None:
        """Put a stored JobOnNode row into memory (at start)."""
        self.stats[(job_id, node_id)] = stat
        self._by_job.setdefault(job_id, {})[node_id] = stat
        if stat.mean is not None and stat.count:
            self._add_family(family, node_id, stat.mean * stat.count, stat.count)

    def record(self, job_id: int, node_id: int, family: str, duration: float | None) -> Learned:
        """Record an execution: a duration on success, None on failure."""
        stat = self.stats.get((job_id, node_id))
        if stat is None:
            stat = self.stats[(job_id, node_id)] = Learned()
            self._by_job.setdefault(job_id, {})[node_id] = stat
        if duration is None:
            stat.failures += 1
        else:
            stat.add(duration)
            self._add_family(family, node_id, duration, 1)
        return stat

    def _add_family(self, family: str, node_id: int, total: float, count: int) -> None:
        per = self._family.setdefault(family, {})
        for key in (node_id, None):
            acc = per.setdefault(key, [0.0, 0])
            acc[0] += total
            acc[1] += count

    def family_mean(self, family: str, node_id: int | None = None) -> float | None:
        acc = self._family.get(family, {}).get(node_id)
        return acc[0] / acc[1] if acc and acc[1] else None

    def expected(self, job: JobInfo, node: NodeLoad) -> float:
        """Expected seconds of ``job`` on ``node``: learned, else the fallbacks in order.

        1. the job's recent duration on this node;
        2. the job's mean on other nodes, scaled by their speed over this node's;
        3. the family's mean on this node;
        4. the family's mean on all nodes, scaled by this node's speed;
        5. the default duration, scaled by this node's speed.
        """
        stat = self.stats.get((job.id, node.id))
        if stat is not None and stat.recent is not None:
            return stat.recent
        speed = max(node.speed, 1e-6)
        others = self._by_job.get(job.id)
        if others:
            total = weight = 0.0
            for other_id, other in others.items():
                if other.mean is None:
                    continue
                other_speed = self.node_speed.get(other_id, 1.0)
                total += other.mean * other_speed * other.count
                weight += other.count
            if weight:
                return total / weight / speed
        fam = self.family_mean(job.family, node.id)
        if fam is not None:
            return fam
        fam = self.family_mean(job.family)
        if fam is not None:
            return fam / speed
        return self.default_duration / speed


class Placement:
    """Base class of placement strategies.

    Subclasses set :attr:`name` and override :meth:`choose` (one job) and, if
    they like, :meth:`order` (which jobs go first) or :meth:`place` (a batch).
    Parameters come from the family's ``strategy_params`` as keyword arguments.
    """

    name: ClassVar[str] = ""

    def __init__(self, **params: Any) -> None:
        self.params = params

    def order(self, jobs: list[JobInfo], knowledge: Knowledge) -> list[JobInfo]:
        """The order in which jobs get nodes (and are sent): highest priority first."""
        return sorted(jobs, key=lambda job: -job.priority)

    def choose(
        self, job: JobInfo, candidates: Sequence[NodeLoad], knowledge: Knowledge
    ) -> NodeLoad | None:
        """Pick one of ``candidates`` (never empty) for ``job``; None leaves it unplaced."""
        raise NotImplementedError

    def place(
        self,
        jobs: list[JobInfo],
        candidates: Callable[[JobInfo], Sequence[NodeLoad]],
        knowledge: Knowledge,
    ) -> list[tuple[JobInfo, NodeLoad]]:
        """Place a batch: each job (in :meth:`order`) on the node :meth:`choose` returns.

        The chosen node's ``queued_*`` figures grow as jobs land on it, so later
        choices in the same batch see them.
        """
        out: list[tuple[JobInfo, NodeLoad]] = []
        for job in self.order(jobs, knowledge):
            nodes = candidates(job)
            if not nodes:
                continue
            node = self.choose(job, nodes, knowledge)
            if node is None:
                continue
            node.queued_jobs += 1
            node.queued_work += knowledge.expected(job, node)
            out.append((job, node))
        return out


class LeastLoaded(Placement):
    """The node whose queue of expected work ends first, per slot (ties: fewest jobs)."""

    name = "least_loaded"

    def choose(
        self, job: JobInfo, candidates: Sequence[NodeLoad], knowledge: Knowledge
    ) -> NodeLoad | None:
        usable = [n for n in candidates if n.id not in job.failed_on] or list(candidates)
        return min(usable, key=lambda n: (n.queued_jobs / max(1, n.slots), n.id))


STRATEGIES: dict[str, type[Placement]] = {}


def register(cls: type[Placement]) -> type[Placement]:
    """Make a strategy selectable by its ``name`` (usable as a class decorator)."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    STRATEGIES[cls.name] = cls
    return cls


for _cls in (LeastLoaded,):
    register(_cls)


def strategy(name: str, params: dict[str, Any] | None = None) -> Placement:
    """An instance of the strategy registered as ``name``, built with ``params``."""
    if name not in STRATEGIES:
        for ep in entry_points(group="jodl.placements"):
            if ep.name == name:
                register(ep.load())
    try:
        cls = STRATEGIES[name]
    except KeyError:
        known = ", ".join(sorted(STRATEGIES))
        raise ValueError(f"unknown placement strategy {name!r} (known: {known})") from None
    return cls(**(params or {}))


def known() -> Iterable[str]:
    return sorted(STRATEGIES)
