"""Sources of on-demand jobs for a serving master (:meth:`Master.serve`)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Protocol

from ..log.records import PendingJob
from .leadership import Leadership
from .records import RunSummary
from .slot import NodeSlot


class FeedHost(Protocol):
    """What a feeder sees of the serving master (:class:`~jodl.master.loop.Master`)."""

    name: str
    #: True for a master of a share of the families (several masters serve).
    per_family: bool
    leadership: Leadership

    @property
    def nodes(self) -> dict[int, NodeSlot]: ...

    @property
    def pending(self) -> dict[int, PendingJob]: ...

    def leads(self, family: str) -> bool: ...

    def request_cycle(self, family_name: str) -> Future[RunSummary]: ...

    def cancel(self, job_ids: list[int], reason: str = ...) -> int: ...

    def wake(self) -> None:
        """End the master's pause between loop steps (any thread): jobs are waiting."""


class Feeder:
    """A source of on-demand jobs for :meth:`Master.serve` (e.g. the on-demand queue).

    ``claim`` is called once per loop step from the master's thread and returns
    jobs (with ``run_id`` None and ``claim`` set to their claimed attempt) that
    the master places and runs like jobs of a cycle.
    """

    def claim(self, master: FeedHost, limit: int) -> list[PendingJob]:
        raise NotImplementedError

    def close(self) -> None:
        """Called by :meth:`Master.close`: stop, and give back what was taken but not run."""

    def hand_over(self, families: list[str]) -> None:
        """Called before ``master`` hands the idle ``families`` to another master: record
        what it finished of them (the next leader adopts only what is left)."""

    def take_over(self, master: FeedHost, families: list[str] | None = None) -> None:
        """Called when ``master`` became leader of ``families`` (None: of everything)
        after another: adopt what that one took and did not finish (its unfinished
        runs are resumed by the master itself)."""


__all__ = ["FeedHost", "Feeder"]
