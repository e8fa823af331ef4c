"""When a tracked page is due: trackings' schedules, their bounds, and each page's due time.

A tracking checks its page every ``every`` seconds, or on its own cron expression,
or (neither) on the operator's ``JODL_SCHEDULE``. A page is fetched once per due
time however many track it: its due time is the earliest next due among its
*active* trackings, stored as the not-before time of its one ``check_page`` job
(``Job.due_at``, set with :meth:`jodl.log.JobLog.set_due`); a cycle's run takes the
jobs due when it opens. How this maps onto the library's cycles: docs/schedules.md.

Times here are naive UTC, as the log's; cron fields are local time (the scheduler's).
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from jodl.admin.families import cron_trigger
from jodl.exceptions import JodlError

from ..settings import SCHEDULE_OFF, AppSettings

#: Seconds per unit of a duration (``90s``, ``15m``, ``2h``, ``1d``, ``1w``).
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_DURATION = re.compile(r"^\s*(\d{1,7})\s*([smhdw])\s*$", re.IGNORECASE)
#: Characters a tracking's cron expression may have (five fields).
CRON_LENGTH = 100
#: How far ahead a cron expression's fires are read to find its shortest gap: a year
#: catches monthly and yearly patterns; at most this many fires (with gaps of at least
#: the minimum interval they already cover days) keep the check under a second.
CRON_HORIZON = dt.timedelta(days=366)
CRON_FIRES_READ = 3000


class ScheduleError(JodlError):
    """A schedule the page checker refuses (one line naming the value)."""


@dataclass(frozen=True)
class Schedule:
    """A tracking's schedule: ``every`` seconds, or ``cron``, or neither (the default)."""

    every: int | None = None
    cron: str | None = None

    def describe(self) -> str:
        """ "every 15 min", "cron */30 * * * *" or "default schedule"."""
        if self.every is not None:
            return f"every {describe_seconds(self.every)}"
        if self.cron is not None:
            return f"cron {self.cron}"
        return "default schedule"


def describe_seconds(seconds: int) -> str:
    """``900`` -> "15 min", ``7200`` -> "2 h", ``86400`` -> "1 day", ``604800`` -> "1 week"."""
    for size, unit in ((604800, "week"), (86400, "day")):
        if seconds % size == 0:
            count = seconds // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


def parse_duration(text: str | int) -> int:
    """Seconds of ``15m``, ``2h``, ``1d``, ``1w``, ``90s`` (or a whole number of seconds);
    :class:`ScheduleError` naming the value otherwise. Bounds: :func:`check_schedule`."""
    if isinstance(text, bool):
        raise ScheduleError(f"interval {text!r}: a duration such as 15m, 2h, 1d, 1w or 90s")
    if isinstance(text, int):
        return text
    if isinstance(text, str) and text.strip().isdigit() and len(text.strip()) <= 9:
        return int(text)
    match = _DURATION.match(text) if isinstance(text, str) else None
    if match is None:
        raise ScheduleError(f"interval {text!r}: a duration such as 15m, 2h, 1d, 1w or 90s")
    return int(match.group(1)) * UNITS[match.group(2).lower()]


def check_schedule(every: int | None, cron: str | None, settings: AppSettings) -> Schedule:
    """The schedule to store, or :class:`ScheduleError` in one line: not both, an interval
    within ``JODL_CHECK_EVERY_MIN``/``_MAX``, a cron expression of five fields that
    never fires twice within the minimum."""
    low, high = settings.check_every_min, settings.check_every_max
    if every is not None and cron is not None:
        raise ScheduleError("give an interval or a cron expression, not both")
    if every is not None:
        if not low <= every <= high:
            raise ScheduleError(
                f"interval {describe_seconds(every)} ({every} s) is outside the operator's "
                f"bounds: {describe_seconds(low)} to {describe_seconds(high)}"
            )
        return Schedule(every=every)
    if cron is not None:
        cron = " ".join(cron.split())
        trigger = _cron(cron)
        gap = shortest_gap(trigger)
        if gap is not None and gap < low:
            raise ScheduleError(
                f"cron {cron!r} fires every {describe_seconds(int(gap))} at times, more often "
                f"than the operator's minimum of {describe_seconds(low)}"
            )
        return Schedule(cron=cron)
    return Schedule()


def check_schedule_of(
    every: str | int | None, cron: str | None, settings: AppSettings | None = None
) -> Schedule:
    """A tracking's schedule from an interval (``15m``, ``2h``, ``1d``, ``1w``, ``90s`` or
    whole seconds) or a cron expression (neither: the operator's ``JODL_SCHEDULE``),
    within the operator's bounds (default: the environment's settings);
    :class:`ScheduleError` in one line naming the value."""
    seconds = None if every is None or every == "" else parse_duration(every)
    return check_schedule(seconds, cron or None, settings or AppSettings.from_env())


def _cron(expression: str, timezone: Any = None) -> Any:
    if len(expression) > CRON_LENGTH or len(expression.split()) != 5:
        raise ScheduleError(
            f"cron {expression!r}: five fields (MIN HOUR DAY MONTH WEEKDAY), e.g. '*/30 * * * *'"
        )
    try:
        return cron_trigger(expression, timezone or local_zone())
    except ValueError as exc:
        raise ScheduleError(f"cron {expression!r}: {exc}") from None


def shortest_gap(trigger: Any, now: dt.datetime | None = None) -> float | None:
    """The shortest time in seconds between two fires of ``trigger`` over the next
    :data:`CRON_HORIZON` (at most :data:`CRON_FIRES_READ` fires); None: fewer than two."""
    start = now or dt.datetime.now(dt.UTC)
    previous: dt.datetime | None = None
    shortest: float | None = None
    after = start
    for _ in range(CRON_FIRES_READ):
        fire = trigger.get_next_fire_time(previous, after)
        if fire is None or fire - start > CRON_HORIZON:
            break
        if previous is not None:
            gap = (fire - previous).total_seconds()
            shortest = gap if shortest is None else min(shortest, gap)
        previous = fire
        after = fire + dt.timedelta(seconds=1)
    return shortest


def local_zone() -> Any:
    """The local time zone, which cron fields are read in (as the scheduler reads them)."""
    from tzlocal import get_localzone

    return get_localzone()


# -- due times ---------------------------------------------------------------------------------


def _aware(when: dt.datetime) -> dt.datetime:
    return when.replace(tzinfo=dt.UTC)


def _naive(when: dt.datetime) -> dt.datetime:
    return when.astimezone(dt.UTC).replace(tzinfo=None)


class Clock:
    """Reads schedules against one default (``JODL_SCHEDULE``) and one time zone."""

    def __init__(self, settings: AppSettings, timezone: Any = None) -> None:
        self.settings = settings
        self.zone = timezone or local_zone()
        self._triggers: dict[str, Any] = {}
        off = settings.schedule == SCHEDULE_OFF
        self.default = None if off else cron_trigger(settings.schedule, self.zone)

    def trigger(self, schedule: Schedule) -> Any:
        """The cron trigger of a schedule without an interval (None: the schedule is off)."""
        if schedule.cron is None:
            return self.default
        if schedule.cron not in self._triggers:
            self._triggers[schedule.cron] = cron_trigger(schedule.cron, self.zone)
        return self._triggers[schedule.cron]

    def next_due(
        self, schedule: Schedule, anchor: dt.datetime | None, now: dt.datetime
    ) -> dt.datetime | None:
        """When a tracking is next due (naive UTC): ``anchor`` (the start of the cycle
        that last checked the page) plus its interval, or its cron's next fire after
        ``anchor``; ``now`` when never checked. None: it asks for no time of its own
        (no schedule of its own and ``JODL_SCHEDULE=off``)."""
        if schedule.every is None and self.trigger(schedule) is None:
            return None
        if anchor is None:
            return now
        if schedule.every is not None:
            return anchor + dt.timedelta(seconds=schedule.every)
        # Strictly after: a fire time is due at or after itself, and a page checked by
        # the 06:00 cycle must not be due at 06:00 again.
        after = _aware(anchor) + dt.timedelta(seconds=1)
        fire = self.trigger(schedule).get_next_fire_time(None, after)
        return None if fire is None else _naive(fire)

    def interval(self, schedule: Schedule, now: dt.datetime) -> float | None:
        """Seconds between two due times of a schedule (a cron's two next fires)."""
        if schedule.every is not None:
            return float(schedule.every)
        trigger = self.trigger(schedule)
        if trigger is None:
            return None
        first = trigger.get_next_fire_time(None, _aware(now))
        second = first and trigger.get_next_fire_time(first, first + dt.timedelta(seconds=1))
        return None if not second else (second - first).total_seconds()

    def page_due(
        self, schedules: Iterable[Schedule], anchor: dt.datetime | None, now: dt.datetime
    ) -> dt.datetime | None:
        """A page's due time: the earliest among its active trackings' (None: any run)."""
        dues = [d for s in schedules if (d := self.next_due(s, anchor, now)) is not None]
        return min(dues) if dues else None


def floor_to_tick(when: dt.datetime, tick: float) -> dt.datetime:
    """``when`` (naive UTC) down to the scheduler's tick grid (multiples of ``tick``
    seconds since the epoch, where the ticks fire), so that a page checked by a cycle
    a tick started is due again exactly a whole interval later, not a tick later."""
    if tick <= 0:
        return when
    seconds = _aware(when).timestamp()
    return _naive(dt.datetime.fromtimestamp(seconds - seconds % tick, dt.UTC))


def shortest_interval(
    clock: Clock, schedules: Mapping[int, Iterable[Schedule]], now: dt.datetime
) -> float | None:
    """The shortest interval among these pages' schedules (page id -> its schedules)."""
    found = [
        i for page in schedules.values() for s in page if (i := clock.interval(s, now)) is not None
    ]
    return min(found) if found else None
