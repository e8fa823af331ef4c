"""The master's parts in one handle (as dask's ``WorkStealing(scheduler)`` holds one
reference to its scheduler).

:class:`Parts` holds what every part of a leading master shares: its settings, the
fenced log, the job book and ledger, the families' settings, what it learned, the
open runs, and the lease epoch its writes and calls carry. :class:`~jodl.master.loop.
Master` makes one per :meth:`~jodl.master.loop.Master.build` and hands it to each part
(nodes, outcomes, dispatch, balancing, runs, controls), with the few parts a part
calls directly. The parts built later announce what earlier ones call back
(``watcher``, ``node_gone``, ``first_batch``): nothing is patched into a part after
it is made, and the epoch changes in one place (:meth:`Master.set_epoch`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from ..log.records import PendingJob
from ..log.store import Store
from ..placement import Knowledge
from ..settings.config import Settings
from .book import JobBook
from .families import FamilySettings
from .gauges import MasterGauges
from .leadership import Leadership
from .records import ActiveRun, Ledger
from .slot import NodeSlot
from .versions import Versions


class ResultWatcher(Protocol):
    """Told of every result before it is committed (the balancing part learns): those of
    one report of an agent at once, each as (job, seconds it took, where and for how
    long it was placed)."""

    def results(
        self, slot: NodeSlot, done: list[tuple[PendingJob, float, tuple[int, float] | None]]
    ) -> None: ...


def _no_node(_node_id: int) -> None:
    return None


def _no_batch() -> int:
    return 0


@dataclass(eq=False)
class Parts:
    """What a leading master's parts share (see the module doc)."""

    settings: Settings
    store: Store
    #: This master's name (its lease holder name).
    name: str
    leadership: Leadership
    book: JobBook
    ledger: Ledger
    families: FamilySettings
    knowledge: Knowledge
    versions: Versions
    gauges: MasterGauges
    #: Open runs by id.
    runs: dict[int, ActiveRun] = field(default_factory=dict)
    #: Called with (done, total) as results of a run come in (``jodl run``'s progress).
    progress: Callable[[int, int], None] | None = None
    #: The lease epoch of this master's writes and calls (0: it leads nothing yet).
    epoch: int = 0
    #: Told of each result before its commit: the balancing part, once made.
    watcher: ResultWatcher | None = None
    #: Called with a node's id when it is given up on: the balancer's trial moves.
    node_gone: Callable[[int], None] = _no_node
    #: How many jobs of a resumed run to read before its first send (the dispatcher's
    #: answer: one batch per agent).
    first_batch: Callable[[], int] = _no_batch


class PartOf:
    """Base of a master's part: its handle, and the epoch read from it."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    @property
    def epoch(self) -> int:
        return self.parts.epoch


__all__ = ["PartOf", "Parts", "ResultWatcher"]
