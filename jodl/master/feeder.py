"""Sources of on-demand jobs for a serving master (:meth:`Master.serve`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..log.records import PendingJob
    from .loop import Master


class Feeder:
    """A source of on-demand jobs for :meth:`Master.serve` (e.g. the on-demand queue).

    ``claim`` is called once per loop step from the master's thread and returns
    jobs (with ``run_id`` None and ``claim`` set to their claimed attempt) that
    the master places and runs like jobs of a cycle.
    """

    def claim(self, master: Master, limit: int) -> list[PendingJob]:
        raise NotImplementedError

    def close(self) -> None:
        """Called by :meth:`Master.close`: stop, and give back what was taken but not run."""

    def hand_over(self, families: list[str]) -> None:
        """Called before ``master`` hands the idle ``families`` to another master: record
        what it finished of them (the next leader adopts only what is left)."""

    def take_over(self, master: Master, families: list[str] | None = None) -> None:
        """Called when ``master`` became leader of ``families`` (None: of everything)
        after another: adopt what that one took and did not finish (its unfinished
        runs are resumed by the master itself)."""


__all__ = ["Feeder"]
