"""What the master has learned: durations per (job, node) and node speeds (:class:`Knowledge`).

Every strategy asks :meth:`Knowledge.expected` how long a job would take on a
node; the answer falls back from what was measured to :data:`DEFAULT_DURATION`.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .view import JobInfo, NodeLoad

#: Duration assumed for a job nothing is known about (seconds, at speed 1.0).
#: Only a family's first jobs meet it: after one result the family's mean replaces it
#: (see :meth:`Knowledge.expected`), and among jobs equally unknown only the order
#: matters. Half a second is long against what a move costs (a round trip of about a
#: millisecond on a LAN plus the balancing's 5 ms steal margin), so an idle node may
#: steal a job nothing is known about instead of waiting; and short enough that a
#: first job stuck for a second (twice its guess: the balancing's straggler factor)
#: of an idempotent family gets a backup copy early.
DEFAULT_DURATION = 0.5
#: Weight of the newest duration in the recent (exponentially weighted) mean.
RECENT_WEIGHT = 0.3
#: Jobs seen on several nodes used to fit node speeds at most (a spread sample).
SPEED_SAMPLE = 3000


@dataclass(slots=True)
class Learned:
    """Statistics of one job on one node (mirrors a JobOnNode row)."""

    count: int = 0
    failures: int = 0
    mean: float | None = None
    recent: float | None = None
    m2: float = 0.0
    last: float | None = None
    #: The node these statistics are of (set when :class:`Knowledge` files them).
    node_id: int = -1

    @property
    def spread(self) -> float:
        """Standard deviation of the durations seen (0 with fewer than two)."""
        return math.sqrt(self.m2 / (self.count - 1)) if self.count > 1 else 0.0

    def add(self, duration: float) -> None:
        """Record one successful execution (Welford mean/variance, EWMA recent)."""
        self.count += 1
        if self.mean is None:  # the first: one float for all three, m2 stays the shared 0.0
            self.mean = self.recent = self.last = duration
            return
        delta = duration - self.mean
        self.mean += delta / self.count
        self.m2 += delta * (duration - self.mean)
        self.recent = (
            duration
            if self.recent is None
            else (RECENT_WEIGHT * duration + (1 - RECENT_WEIGHT) * self.recent)
        )
        self.last = duration


def _observed(stat: Learned) -> bool:
    """Whether ``stat`` holds a positive mean duration (what speed fitting uses)."""
    return bool(stat.count and stat.mean and stat.mean > 0)


class Knowledge:
    """Learned durations per (job, node) and node speeds, with the fallbacks of :meth:`expected`.

    A master keeps what it learned of every job of its families, a million jobs
    included, so the statistics are filed compactly: per job, the one
    :class:`Learned` of the node it ran on, or a dict of them once it ran on
    several (most jobs run on one node; a dict costs three times a slotted record).
    """

    def __init__(self, default_duration: float = DEFAULT_DURATION) -> None:
        self.default_duration = default_duration
        #: job -> what is known of it: one node's statistics, or per node when several.
        self._by_job: dict[int, Learned | dict[int, Learned]] = {}
        #: The jobs filed per node (seen on several), in the order they became so: where
        #: :meth:`learn_speeds` samples, not a walk over every job (0.4 µs a job at the
        #: end of a repeat cycle of no-op jobs). Eight bytes a job, not a set's forty.
        self._several: array[int] = array("q")
        # family -> node -> [sum, count]; node None = all nodes
        self._family: dict[str, dict[int | None, list[float]]] = {}
        #: Learned speed per node (1.0 = the average node); see :meth:`learn_speeds`.
        #: Read it freely; change it with :meth:`set_speeds` (learned work depends on it).
        self.node_speed: dict[int, float] = {}
        #: job -> its learned work (:meth:`work`), until the job or a speed changes.
        self._work: dict[int, float | None] = {}

    def learned(self, job_id: int, node_id: int) -> Learned | None:
        """What is known of ``job_id`` on ``node_id`` (None: it never ran there)."""
        known = self._by_job.get(job_id)
        if isinstance(known, Learned):
            return known if known.node_id == node_id else None
        return None if known is None else known.get(node_id)

    def knows(self, job_id: int) -> bool:
        """Whether anything was learned of ``job_id`` (if not, :meth:`expected` gives it
        what the family's jobs take on each node, the same for every such job)."""
        return job_id in self._by_job

    def of_job(self, job_id: int) -> dict[int, Learned]:
        """Per node, what is known of ``job_id``."""
        known = self._by_job.get(job_id)
        if known is None:
            return {}
        return {known.node_id: known} if isinstance(known, Learned) else known

    def _file(self, job_id: int, node_id: int, stat: Learned) -> None:
        stat.node_id = node_id
        known = self._by_job.get(job_id)
        if known is None:
            self._by_job[job_id] = stat
        elif isinstance(known, Learned):
            self._by_job[job_id] = {known.node_id: known, node_id: stat}
            self._several.append(job_id)
        else:
            known[node_id] = stat

    def load(self, job_id: int, node_id: int, stat: Learned, family: str) -> None:
        """Put a stored JobOnNode row into memory (at start)."""
        self._file(job_id, node_id, stat)
        self._work.pop(job_id, None)
        if stat.mean is not None and stat.count:
            self._add_family(family, node_id, stat.mean * stat.count, stat.count)

    def record(self, job_id: int, node_id: int, family: str, duration: float | None) -> Learned:
        """Record an execution: a duration on success, None on failure."""
        stat = self.learned(job_id, node_id)
        if stat is None:
            stat = Learned()
            self._file(job_id, node_id, stat)
        if duration is None:
            stat.failures += 1
        else:
            stat.add(duration)
            self._add_family(family, node_id, duration, 1)
            self._work.pop(job_id, None)
        return stat

    def _add_family(self, family: str, node_id: int, total: float, count: int) -> None:
        per = self._family.get(family)
        if per is None:
            per = self._family[family] = {}
        for key in (node_id, None):
            acc = per.get(key)
            if acc is None:
                per[key] = [0.0 + total, count]
            else:
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
        known = self._by_job.get(job_id)
        if known is None:  # nothing learned: nothing to cache (a cycle's first jobs)
            return None
        if type(known) is Learned:  # one node (most jobs): not worth a cache entry
            if known.mean is None or not known.count:
                return None
            return known.mean * self.node_speed.get(known.node_id, 1.0)
        try:
            return self._work[job_id]
        except KeyError:
            pass
        total = weight = 0.0
        for node_id, stat in self.of_job(job_id).items():
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
        stat = self.learned(job.id, node.id)
        if stat is not None and stat.recent is not None:
            return stat.recent
        work = self.work(job.id)
        if work is not None:
            return work / max(node.speed, 1e-6)
        return self.unknown(job.family, node)

    def unknown(self, family: str, node: NodeLoad) -> float:
        """What :meth:`expected` gives on ``node`` a job of ``family`` nothing is known of
        (fallbacks 3 to 5)."""
        fam = self.family_mean(family, node.id)
        if fam is not None:
            return fam
        fam = self.family_mean(family)
        return (fam if fam is not None else self.default_duration) / max(node.speed, 1e-6)

    def expected_on(self, job: JobInfo, nodes: Sequence[NodeLoad]) -> list[float]:
        """:meth:`expected` of ``job`` on each of ``nodes``, in one call (placement asks
        for every candidate of every job: the per-node lookups are shared)."""
        known = self._by_job.get(job.id)
        if known is None:
            return [self.unknown(job.family, node) for node in nodes]
        if type(known) is Learned:  # one node (most jobs): work() and learned() inline
            if known.mean is not None and known.count:
                per = known.mean * self.node_speed.get(known.node_id, 1.0)
                there, recent = known.node_id, known.recent
                if recent is None:
                    there = -1
                # A loop and a comparison, not a comprehension and max(): half the time
                # (placement asks this of every job of a repeat cycle).
                took: list[float] = []
                for node in nodes:
                    if node.id == there:
                        took.append(recent)  # type: ignore[arg-type]
                    else:
                        speed = node.speed
                        took.append(per / (speed if speed > 1e-6 else 1e-6))
                return took
            single: Learned | None = known
            work: float | None = None
        else:
            single = None
            work = self.work(job.id)
        out = []
        for node in nodes:
            if single is not None:
                stat = single if single.node_id == node.id else None
            else:
                stat = known.get(node.id)  # type: ignore[union-attr]
            if stat is not None and stat.recent is not None:
                out.append(stat.recent)
            elif work is not None:
                out.append(work / max(node.speed, 1e-6))
            else:
                out.append(self.unknown(job.family, node))
        return out

    def learn_speeds(self, iterations: int = 30) -> dict[int, float]:
        """Re-estimate every node's speed from what was learned; returns (and keeps) them.

        Durations are modelled as ``work(job) / speed(node)``. Jobs seen on several
        nodes pin the speed ratios (fitted in log space, weighted by executions);
        a node that shares no job with others keeps the estimate from its family
        means (the mean of a family's jobs there against their mean everywhere).
        Speeds are scaled so that their mean over the nodes seen is 1.0.
        """
        nodes = {
            n for per in self._family.values() for n, acc in per.items() if n is not None and acc[1]
        }
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
        # Jobs seen on several nodes (most jobs ran on one: they say nothing about
        # ratios); of many, a spread sample keeps this cheap on huge families. Only the
        # sample's observations are built: all of a 300,000-job family's took 15 MB at
        # the end of its second run, where the master's memory peaks.
        several = self._several
        if len(several) > SPEED_SAMPLE:
            step = len(several) / SPEED_SAMPLE
            picked: Sequence[int] = [several[int(i * step)] for i in range(SPEED_SAMPLE)]
        else:
            picked = several
        shared: dict[int, dict[int, tuple[float, float]]] = {}
        for job_id in picked:
            obs = {
                n: (math.log(st.mean), float(st.count))  # type: ignore[arg-type]
                for n, st in self._by_job[job_id].items()  # type: ignore[union-attr]
                if _observed(st)
            }
            if len(obs) > 1:
                shared[job_id] = obs
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
