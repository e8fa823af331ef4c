"""What a placement strategy sees of jobs and nodes: :class:`JobInfo`, :class:`NodeLoad`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple


class JobInfo(NamedTuple):
    """What a strategy may know of a job (a named tuple: cheap to make per job and step)."""

    id: int
    key: str
    family: str
    priority: int = 0
    #: The job's home: the node it returns to (its assignment).
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


def per_cycle(
    every_n_cycles: int = 1, min_interval: float | None = None, period: float | None = None
) -> float:
    """Expected runs per cycle of a job due every ``every_n_cycles`` cycles and not more
    often than every ``min_interval`` seconds, when cycles start every ``period`` seconds."""
    rate = 1.0 / max(1, every_n_cycles)
    if min_interval and period and period > 0:
        rate = min(rate, period / min_interval)
    return rate
