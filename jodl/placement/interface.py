"""The strategy interface, :class:`Placement`, and what balancing shows it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from .knowledge import Knowledge
from .view import JobInfo, NodeLoad


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

    def placements(
        self,
        jobs: list[JobInfo],
        candidates: Callable[[JobInfo], Sequence[NodeLoad]],
        knowledge: Knowledge,
    ) -> list[tuple[JobInfo, NodeLoad, float]]:
        """:meth:`place`, each job with what it is expected to take on its node (the
        seconds :meth:`place` counted into the node's ``queued_work``). The master
        places through this; a strategy that knows those figures while placing
        returns them instead of having each asked again."""
        return [
            (job, node, knowledge.expected(job, node))
            for job, node in self.place(jobs, candidates, knowledge)
        ]

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
