"""A settable clock for tests that move time without sleeping."""

from __future__ import annotations

import datetime as dt


class Clock:
    """Naive UTC datetimes (like the rest of the log), starting at ``start``."""

    def __init__(self, start: dt.datetime) -> None:
        self.now = start

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)
