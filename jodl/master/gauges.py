"""The master's gauges: nodes, runs and the log writer, set from what the loop keeps.

Set at most once per :data:`MasterGauges.PERIOD` (often enough for a dashboard or
``jodl status --watch``, rarely enough that the loop never notices); the runs'
progress in the log is written beside them by the run keeper
(:meth:`jodl.master.runs.RunKeeper.record_progress`), a fenced write of the master.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sized

from ..obs.metrics import (
    NODE_IN_FLIGHT,
    NODE_ROUND_TRIP,
    NODE_SLOTS,
    NODE_SLOTS_BUSY,
    NODE_SPEED,
    NODE_UP,
    RUN_JOBS_DONE,
    RUN_JOBS_TOTAL,
    WRITER_QUEUE,
)
from .records import ActiveRun
from .slot import NodeSlot


class MasterGauges:
    """Sets the master's gauges at most once per :data:`PERIOD` (:meth:`due`)."""

    #: Seconds between two updates.
    PERIOD = 1.0

    def __init__(self) -> None:
        self.next_at = 0.0

    def due(self) -> bool:
        """True at most once per :data:`PERIOD`: the gauges are set now."""
        now = time.monotonic()
        if now < self.next_at:
            return False
        self.next_at = now + self.PERIOD
        return True

    def update(
        self,
        slots: Iterable[NodeSlot],
        flights: Mapping[int, Sized],
        writer_depth: int,
        runs: Iterable[ActiveRun],
    ) -> None:
        for slot in slots:
            node = slot.link.address
            NODE_UP.labels(node).set(1 if slot.usable else 0)
            NODE_SLOTS.labels(node).set(slot.load.slots)
            in_flight = len(flights.get(slot.id, ()))
            NODE_IN_FLIGHT.labels(node).set(in_flight)
            NODE_SLOTS_BUSY.labels(node).set(min(slot.load.slots, in_flight))
            NODE_SPEED.labels(node).set(slot.load.speed)
            NODE_ROUND_TRIP.labels(node).set(slot.link.call_time)
        WRITER_QUEUE.set(writer_depth)
        for active in runs:
            self.run_counts(active)

    @staticmethod
    def run_counts(active: ActiveRun) -> None:
        """A run's gauges: its counts so far (or its final ones, once it closed)."""
        RUN_JOBS_TOTAL.labels(active.family.name).set(active.total)
        RUN_JOBS_DONE.labels(active.family.name).set(active.done)


__all__ = ["MasterGauges"]
