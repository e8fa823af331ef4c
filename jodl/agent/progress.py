"""How far the jobs an agent runs are, as they report it (``jodl.progress``).

A job reports ``done`` out of ``total`` (None: unknown) and a short note; the board
keeps the newest report of each running job, forgets it when the job ends, and hands
all of them to a master that asks (``progress``). It holds one entry per running job
at most, so it is bounded by the agent's slots.
"""

from __future__ import annotations

import math
import threading
import time

#: Longest note kept (a longer one is cut).
MAX_NOTE = 200

#: A report as it crosses the wire: exec_id, done, total (or None), note, unix time.
Report = tuple[int, float, float | None, str, float]


class ProgressBoard:
    """The newest report of each running job."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: exec_id -> its newest report.
        self._reports: dict[int, Report] = {}

    def report(self, exec_id: int, done: float, total: float | None, note: str) -> None:
        """Keep ``exec_id``'s report (a ValueError for numbers that are not finite or
        below zero: the job learns at once that its call is wrong)."""
        done = float(done)
        if not math.isfinite(done) or done < 0:
            raise ValueError(f"progress: done must be a finite number >= 0, not {done!r}")
        if total is not None:
            total = float(total)
            if not math.isfinite(total) or total < 0:
                raise ValueError(f"progress: total must be a finite number >= 0, not {total!r}")
        with self._lock:
            self._reports[exec_id] = (exec_id, done, total, str(note)[:MAX_NOTE], time.time())

    def forget(self, exec_id: int) -> None:
        """The job ended: its report goes (its outcome tells the rest)."""
        with self._lock:
            self._reports.pop(exec_id, None)

    def reports(self) -> tuple[Report, ...]:
        with self._lock:
            return tuple(self._reports.values())


__all__ = ["MAX_NOTE", "ProgressBoard", "Report"]
