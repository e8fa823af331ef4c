"""Families' cron schedules, honoured by the serving master (``jodl master``).

A family's ``schedule`` (``jodl family set NAME --schedule "0 6 * * *"``; a sixth,
leading field gives seconds) starts a cycle of it at each cron time. An APScheduler
``BackgroundScheduler`` beside the master's loop fires the slot; the cycle is asked of the
master with :meth:`jodl.master.Master.request_cycle` and waited for in the
scheduler's thread, so a family never has two scheduled cycles at once
(``max_instances=1``) and slots passed while one ran fold into one (``coalesce``).

The schedules are read again every :data:`RELOAD` seconds: a schedule set, changed
or turned off with ``jodl family set`` (or the web) holds without a restart. Slots
missed while no master ran are not caught up: the next slot runs.

APScheduler is an optional dependency of the library (``pip install 'jodl[cron]'``;
the applications' extra brings it too): without it a master starts as long as no
family has a schedule, and refuses with one line naming the family otherwise.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from ..exceptions import JodlError
from .families import CRON_EXTRA, FamilyAdmin, cron_trigger

log = logging.getLogger("jodl.schedule")

#: Seconds between two reads of the families' schedules: one small query each time,
#: and an operator's change holds within this delay.
RELOAD = 2.0
#: Seconds between two looks, while a scheduled cycle runs, at whether the master stops.
WAIT_STEP = 1.0
#: Id prefix of a family's job in the scheduler.
JOB_PREFIX = "family:"


class FamilySchedules:
    """Starts a cycle of each scheduled family at its cron times, through ``request_cycle``."""

    def __init__(self, master: Any, timezone: Any = None, reload: float = RELOAD) -> None:
        self.master = master
        self.admin = FamilyAdmin(master.store)
        self.reload = reload
        from apscheduler.schedulers.background import (  # type: ignore[import-untyped]
            BackgroundScheduler,
        )

        self.scheduler = BackgroundScheduler(
            timezone=timezone,
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        #: family -> the cron line its scheduler job was made from.
        self.active: dict[str, str] = {}
        #: family -> a cron line refused (said once, not at every reload).
        self.refused: dict[str, str] = {}
        self._stopping = threading.Event()

    def start(self) -> None:
        self.sync()
        self.scheduler.add_job(self.sync, "interval", seconds=self.reload, id="family-schedules")
        self.scheduler.start()

    def stop(self) -> None:
        self._stopping.set()
        self.scheduler.shutdown(wait=False)

    def sync(self) -> None:
        """Add, change and drop the families' jobs to match the database."""
        try:
            wanted = self.admin.schedules()
        except Exception:  # noqa: BLE001 - the database may be away for a moment
            log.warning("could not read the families' schedules; kept the ones in force")
            return
        for name in [n for n in self.active if n not in wanted]:
            self.scheduler.remove_job(JOB_PREFIX + name)
            del self.active[name]
            log.info("family %s: schedule removed", name, extra={"family": name})
        for name, cron in wanted.items():
            if self.active.get(name) == cron or self.refused.get(name) == cron:
                continue
            try:
                trigger = cron_trigger(cron, self.scheduler.timezone)
            except (ValueError, TypeError) as exc:
                self.refused[name] = cron
                log.warning(
                    "family %s: schedule %r is not a cron line (%s); fix it with "
                    "`jodl family set %s --schedule ...`",
                    name,
                    cron,
                    exc,
                    name,
                    extra={"family": name},
                )
                continue
            self.scheduler.add_job(
                self.cycle, trigger, args=[name], id=JOB_PREFIX + name, replace_existing=True
            )
            self.active[name] = cron
            log.info("family %s: a cycle at %r", name, cron, extra={"family": name})

    def cycle(self, name: str) -> None:
        """One scheduled cycle of ``name``, run by the master; waits for its end.

        With families spread over several masters, only the family's leader runs it
        (every master's schedule fires)."""
        if not self.master.leads(name):
            return
        future = self.master.request_cycle(name)
        try:
            while True:
                try:
                    summary = future.result(timeout=WAIT_STEP)
                    break
                except FutureTimeout:
                    if self._stopping.is_set():  # the master stops: it will not answer
                        future.cancel()
                        return
        except Exception as exc:  # noqa: BLE001 - one failed cycle must not stop the schedule
            log.warning("family %s: scheduled cycle failed: %s", name, exc, extra={"family": name})
            return
        log.info("scheduled %s", summary.line(), extra={"family": name})


def start_family_schedules(master: Any) -> Callable[[], None]:
    """Start the families' schedules beside ``master``; returns the function that stops them.

    Without APScheduler: nothing to start when no family has a schedule, else
    :class:`JodlError` naming the scheduled family and what to install.
    """
    try:
        import apscheduler  # type: ignore[import-untyped]  # noqa: F401
    except ModuleNotFoundError:
        scheduled = FamilyAdmin(master.store).schedules()
        if scheduled:
            name, cron = sorted(scheduled.items())[0]
            raise JodlError(
                f"family {name} has the cron schedule {cron!r} but APScheduler is not "
                f"installed: {CRON_EXTRA} (or turn it off: jodl family set {name} --schedule off)"
            ) from None
        log.debug("APScheduler is not installed and no family has a schedule")
        return lambda: None
    schedules = FamilySchedules(master)
    schedules.start()
    return schedules.stop


__all__ = ["RELOAD", "FamilySchedules", "start_family_schedules"]
