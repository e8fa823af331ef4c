"""Placement: which node runs a job (DESIGN §7) — the interface and what it may see.

A strategy is a small class: :meth:`Placement.choose` picks one node for one job
among the nodes its family may use (FamilyOnNode), from a read-only view of what
the master knows: per node the expected work already queued there, its slots,
its learned speed and the expected work per cycle of the jobs whose home it is
(:class:`NodeLoad`), and per job and node the learned durations
(:class:`Knowledge`). The master calls :meth:`Placement.place` once per loop step
with every job that needs a node, so a strategy sees the whole batch. While
balancing, the master also asks :meth:`Placement.moves` for moves of its own.

Strategies are selected per family by name (``Family.strategy``) with parameters
(``Family.strategy_params``); register your own with :func:`register` or the
entry-point group ``jodl.placements``. The built-in ones live in
:mod:`jodl.strategies`; ``docs/placement.md`` shows how to write one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, ClassVar, NamedTuple

#: Duration assumed for a job nothing is known about (seconds, at speed 1.0).
DEFAULT_DURATION = 0.5
#: Weight of the newest duration in the recent (exponentially weighted) mean.
RECENT_WEIGHT = 0.3
#: Strategy of a family that names none.
DEFAULT_STRATEGY = "earliest_finish"
#: Jobs seen on several nodes used to fit node speeds at most (a spread sample).
SPEED_SAMPLE = 3000


class JobInfo(NamedTuple):
    """What a strategy may know of a job (a named tuple: cheap to make per job and step)."""

    id: int
    key: str
    family: str
    priority: int = 0
    #: The job's home: the node it returns to (thesis: its assignment).
    permanent_node_id: int | None = None
    #: Set while a trial move is in force: the node the job is being tried on.
    trial_node_id: int | None = None
    #: Nodes that failed this job too often in this run (avoid them).
    failed_on: frozenset[int] = frozenset()
    attempts: int = 0
    #: Expected runs per cycle (1.0 = every cycle; 0.25 = every fourth cycle).
    per_cycle: float = 1.0

    @property
    def home(self) -> int | None:
        """Where the job belongs now: its trial node while a trial is in force, else home."""
        return self.trial_node_id if self.trial_node_id is not None else self.permanent_node_id


@dataclass
class NodeLoad:
    """A node as placement sees it; the master keeps ``queued_*`` current."""

    id: int
    address: str
    slots: int = 1
    speed: float = 1.0
    labels: dict[str, Any] = field(default_factory=dict)
    #: Jobs placed on the node in this cycle and not finished.
    queued_jobs: int = 0
    #: Expected seconds of work those jobs represent.
    queued_work: float = 0.0
    #: Expected seconds per cycle of the jobs whose home this node is, each weighted
    #: by how often it is due (a job run every fourth cycle counts a quarter).
    home_work: float = 0.0

    def expected_finish(self, extra: float = 0.0) -> float:
        """Seconds until a job of ``extra`` seconds added now would end (queue per slot + it)."""
        return self.queued_work / max(1, self.slots) + extra


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
    """Learned durations per (job, node) and node speeds, with the fallbacks of DESIGN §7."""

    def __init__(self, default_duration: float = DEFAULT_DURATION) -> None:
        self.default_duration = default_duration
        self.stats: dict[tuple[int, int], Learned] = {}
        self._by_job: dict[int, dict[int, Learned]] = {}
        self._family_of: dict[int, str] = {}
        # family -> node -> [sum, count]; node None = all nodes
        self._family: dict[str, dict[int | None, list[float]]] = {}
        #: Learned speed per node (1.0 = the average node); see :meth:`learn_speeds`.
        #: Read it freely; change it with :meth:`set_speeds` (learned work depends on it).
        self.node_speed: dict[int, float] = {}
        #: job -> its learned work (:meth:`work`), until the job or a speed changes.
        self._work: dict[int, float | None] = {}

    def learned(self, job_id: int, node_id: int) -> Learned | None:
        """What is known of ``job_id`` on ``node_id`` (None: it never ran there)."""
        return self.stats.get((job_id, node_id))

    def of_job(self, job_id: int) -> dict[int, Learned]:
        """Per node, what is known of ``job_id``."""
        return self._by_job.get(job_id, {})

    def load(self, job_id: int, node_id: int, stat: Learned, family: str) -> None:
        """Put a stored JobOnNode row into memory (at start)."""
        self.stats[(job_id, node_id)] = stat
        self._by_job.setdefault(job_id, {})[node_id] = stat
        self._family_of[job_id] = family
        self._work.pop(job_id, None)
        if stat.mean is not None and stat.count:
            self._add_family(family, node_id, stat.mean * stat.count, stat.count)

    def record(self, job_id: int, node_id: int, family: str, duration: float | None) -> Learned:
        """Record an execution: a duration on success, None on failure."""
        stat = self.stats.get((job_id, node_id))
        if stat is None:
            stat = self.stats[(job_id, node_id)] = Learned()
            self._by_job.setdefault(job_id, {})[node_id] = stat
            self._family_of[job_id] = family
        if duration is None:
            stat.failures += 1
        else:
            stat.add(duration)
            self._add_family(family, node_id, duration, 1)
            self._work.pop(job_id, None)
        return stat

    def _add_family(self, family: str, node_id: int, total: float, count: int) -> None:
        per = self._family.setdefault(family, {})
        for key in (node_id, None):
            acc = per.setdefault(key, [0.0, 0])
            acc[0] += total
            acc[1] += count

    def family_mean(self, family: str, node_id: int | None = None) -> float | None:
        """Mean duration of the family's executions on ``node_id`` (None: on all nodes)."""
        acc = self._family.get(family, {}).get(node_id)
        return acc[0] / acc[1] if acc and acc[1] else None

    def speed(self, node_id: int) -> float:
        """Learned speed of a node (1.0 when unknown)."""
        return self.node_speed.get(node_id, 1.0)

    def work(self, job_id: int) -> float | None:
        """The job's learned work: its durations scaled to a node of speed 1.0 (None: unknown)."""
        try:
            return self._work[job_id]
        except KeyError:
            pass
        total = weight = 0.0
        for node_id, stat in self._by_job.get(job_id, {}).items():
            if stat.mean is not None and stat.count:
                total += stat.mean * self.speed(node_id) * stat.count
                weight += stat.count
        work = self._work[job_id] = total / weight if weight else None
        return work

    def estimate_work(self, job: JobInfo) -> float:
        """Learned work of ``job``, else its family's mean work, else the default duration."""
        work = self.work(job.id)
        if work is not None:
            return work
        fam = self.family_mean(job.family)
        return fam if fam is not None else self.default_duration

    def expected(self, job: JobInfo, node: NodeLoad) -> float:
        """Expected seconds of ``job`` on ``node``: learned, else the fallbacks in order.

        1. the job's recent (moving average) duration on this node;
        2. the job's mean on other nodes, scaled by their speed over this node's;
        3. the family's mean on this node;
        4. the family's mean on all nodes, scaled by this node's speed;
        5. the default duration, scaled by this node's speed.
        """
        stat = self.stats.get((job.id, node.id))
        if stat is not None and stat.recent is not None:
            return stat.recent
        speed = max(node.speed, 1e-6)
        work = self.work(job.id)
        if work is not None:
            return work / speed
        fam = self.family_mean(job.family, node.id)
        if fam is not None:
            return fam
        fam = self.family_mean(job.family)
        if fam is not None:
            return fam / speed
        return self.default_duration / speed

    def learn_speeds(self, iterations: int = 30) -> dict[int, float]:
        """Re-estimate every node's speed from what was learned; returns (and keeps) them.

        Durations are modelled as ``work(job) / speed(node)``. Jobs seen on several
        nodes pin the speed ratios (fitted in log space, weighted by executions);
        a node that shares no job with others keeps the estimate from its family
        means (the mean of a family's jobs there against their mean everywhere).
        Speeds are scaled so that their mean over the nodes seen is 1.0.
        """
        nodes = {node_id for (_job, node_id), st in self.stats.items() if st.count}
        if not nodes:
            return dict(self.node_speed)
        # Start from family means: a node where a family's jobs take half the time is 2x.
        num: dict[int, float] = {}
        den: dict[int, float] = {}
        for per in self._family.values():
            everywhere = per.get(None)
            if not everywhere or not everywhere[1]:
                continue
            mean_all = everywhere[0] / everywhere[1]
            for node_id, (total, count) in per.items():
                if node_id is None or not count or total <= 0:
                    continue
                num[node_id] = num.get(node_id, 0.0) + count * math.log(mean_all / (total / count))
                den[node_id] = den.get(node_id, 0.0) + count
        log_s = {n: num[n] / den[n] if den.get(n) else 0.0 for n in nodes}
        shared: dict[int, dict[int, tuple[float, float]]] = {}
        for job_id, seen_on in self._by_job.items():
            if len(seen_on) < 2:
                continue  # most jobs ran on one node: they say nothing about ratios
            obs = {
                n: (math.log(st.mean), float(st.count))
                for n, st in seen_on.items()
                if st.count and st.mean and st.mean > 0
            }
            if len(obs) > 1:
                shared[job_id] = obs
        if len(shared) > SPEED_SAMPLE:  # a spread sample keeps this cheap on huge families
            keys = sorted(shared)
            step = len(keys) / SPEED_SAMPLE
            shared = {keys[int(i * step)]: shared[keys[int(i * step)]] for i in range(SPEED_SAMPLE)}
        linked = {n for obs in shared.values() for n in obs}
        if linked:
            anchor = sum(log_s[n] for n in linked) / len(linked)
            for _ in range(iterations):
                log_w = {
                    j: sum(c * (d + log_s[n]) for n, (d, c) in obs.items())
                    / sum(c for _d, c in obs.values())
                    for j, obs in shared.items()
                }
                acc: dict[int, list[float]] = {n: [0.0, 0.0] for n in linked}
                for j, obs in shared.items():
                    for n, (d, c) in obs.items():
                        acc[n][0] += c * (log_w[j] - d)
                        acc[n][1] += c
                moved = 0.0
                for n in linked:
                    new = acc[n][0] / acc[n][1]
                    moved = max(moved, abs(new - log_s[n]))
                    log_s[n] = new
                shift = anchor - sum(log_s[n] for n in linked) / len(linked)
                for n in linked:
                    log_s[n] += shift
                if moved < 1e-6:
                    break
        speeds = {n: math.exp(v) for n, v in log_s.items()}
        scale = len(speeds) / sum(speeds.values())
        self.set_speeds({n: s * scale for n, s in speeds.items()})
        return dict(self.node_speed)

    def set_speeds(self, speeds: Mapping[int, float]) -> None:
        """Set nodes' speeds (e.g. loaded from the log)."""
        self.node_speed.update(speeds)
        self._work.clear()


@dataclass(frozen=True)
class Move:
    """A move a strategy proposes while balancing: run ``job_id`` on ``node_id`` instead."""

    job_id: int
    node_id: int
    reason: str = "strategy"


@dataclass(frozen=True)
class Waiting:
    """A job placed on a node and not started yet (``sent``: it already is on the agent)."""

    job: JobInfo
    node_id: int
    expected: float
    sent: bool


@dataclass(frozen=True)
class BalanceView:
    """What :meth:`Placement.moves` sees: nodes, the jobs waiting on them, the learning."""

    nodes: Sequence[NodeLoad]
    waiting: Sequence[Waiting]
    knowledge: Knowledge
    #: Nodes with a free slot and nothing waiting.
    idle: frozenset[int]
    #: Measured round trip to each node (seconds).
    rtt: Mapping[int, float]


class Placement:
    """Base class of placement strategies.

    Subclasses set :attr:`name` and override :meth:`choose` (one job) and, if
    they like, :meth:`order` (which jobs go first), :meth:`place` (a batch) or
    :meth:`moves` (moves while balancing). Parameters come from the family's
    ``strategy_params`` as keyword arguments and are kept in :attr:`params`.
    A strategy must not change the view it is given, except through
    :meth:`place`, which accounts each placed job on its node.
    """

    name: ClassVar[str] = ""
    #: True: a job stays on the node :meth:`choose` gave it. Idle nodes do not steal
    #: it and it gets no backup copy elsewhere; only a node that goes away (or fails
    #: it) sends it back to :meth:`choose`. For jobs that must share a node, such as
    #: all pages of one host under that host's politeness limits.
    keeps_nodes: bool = False

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

    def moves(self, view: BalanceView) -> list[Move]:
        """Moves of waiting jobs this strategy wants while balancing (default: none).

        Called when some node is idle; the master performs a move only to a node
        the job's family may use, and only for a job that has not started.
        """
        return []


def usable(job: JobInfo, candidates: Sequence[NodeLoad]) -> list[NodeLoad]:
    """``candidates`` without the nodes that failed ``job`` too often (all if that is all)."""
    nodes = [n for n in candidates if n.id not in job.failed_on]
    return nodes or list(candidates)


def per_cycle(
    every_n_cycles: int = 1, min_interval: float | None = None, period: float | None = None
) -> float:
    """Expected runs per cycle of a job due every ``every_n_cycles`` cycles and not more
    often than every ``min_interval`` seconds, when cycles start every ``period`` seconds."""
    rate = 1.0 / max(1, every_n_cycles)
    if min_interval and period and period > 0:
        rate = min(rate, period / min_interval)
    return rate


def account_homes(jobs: Iterable[JobInfo], nodes: Sequence[NodeLoad], knowledge: Knowledge) -> None:
    """Set each node's ``home_work``: the expected seconds per cycle of the jobs at home there."""
    by_id = {n.id: n for n in nodes}
    for each in nodes:
        each.home_work = 0.0
    for job in jobs:
        home = by_id.get(job.home) if job.home is not None else None
        if home is not None:
            home.home_work += job.per_cycle * knowledge.expected(job, home)


STRATEGIES: dict[str, type[Placement]] = {}


def register(cls: type[Placement]) -> type[Placement]:
    """Make a strategy selectable by its ``name`` (usable as a class decorator)."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    STRATEGIES[cls.name] = cls
    return cls


def strategy(name: str | None, params: dict[str, Any] | None = None) -> Placement:
    """An instance of the strategy registered as ``name``, built with ``params``."""
    from . import strategies as _builtin  # noqa: F401 - registers the built-in strategies

    name = name or DEFAULT_STRATEGY
    if name not in STRATEGIES:
        for ep in entry_points(group="jodl.placements"):
            if ep.name == name:
                register(ep.load())
    try:
        cls = STRATEGIES[name]
    except KeyError:
        known_names = ", ".join(sorted(STRATEGIES))
        raise ValueError(f"unknown placement strategy {name!r} (known: {known_names})") from None
    try:
        return cls(**(params or {}))
    except TypeError as exc:
        raise ValueError(f"bad parameters for placement strategy {name!r}: {exc}") from None


def known() -> Iterable[str]:
    """Names of the registered strategies."""
    from . import strategies as _builtin  # noqa: F401

    return sorted(STRATEGIES)
