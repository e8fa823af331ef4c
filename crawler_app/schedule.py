"""Scheduled application cycles beside a serving master (``jodl master``).

An APScheduler ``BackgroundScheduler`` fires the page-check cycle on the cron
expression ``JODL_SCHEDULE`` (five fields, local time; a sixth leading field
gives seconds; ``off`` turns the schedule off). The cycle runs in the
scheduler's thread; its two job steps ask the serving master (single-threaded)
to run a JODL cycle with ``Master.request_cycle`` and wait for it. A slot with
no tracked page (paused trackings do not count) and no unfinished cycle does nothing.

* One cycle at a time: the job has ``max_instances=1`` and a lock guards the
  cycle; at most one application cycle is open in the database anyway.
* Slots missed while the master was down run **once** at start, not once per
  missed slot: the database says when the last cycle started; if a slot fell
  between then and now (or a cycle is still open) the job's first run is now.
  ``coalesce`` folds slots missed while a long cycle ran into one run.
* The checks of a scheduled cycle start spread over ``JODL_CHECK_SPREAD``
  seconds by a hash of the URL, never more than a quarter of the time to the
  next slot. A cycle an operator asked for is not spread: someone is waiting
  for it, and spreading exists to smooth the load of the daily slot.
* :func:`next_checks` tells the web UI when the schedule next checks a page (its
  slot, its period, its place in the spread).
* Operators' requests for a cycle now (:mod:`crawler_app.cycle_requests`) are
  looked for every :data:`REQUEST_POLL` seconds by an interval job, also with
  ``JODL_SCHEDULE=off``. A request waits while a cycle runs; all requests
  pending when the cycle ends are served by one cycle (trigger ``web``).
* Baseline checks of new trackings (:mod:`crawler_app.baselines`) are stored
  by another interval job as soon as they finish.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from apscheduler.schedulers.background import BackgroundScheduler
from sqlalchemy import Engine, exists, select
from sqlalchemy.exc import SQLAlchemyError

from jodl.exceptions import JodlError
from jodl.log import Reads

from . import baselines, cycle_requests
from .cycle import (
    CycleResult,
    PageCycle,
    RunFamily,
    last_cycle_start,
    open_cycle_step,
    spread_fraction,
)
from .models import Page, Tracking
from .pages import CHECK_FAMILY
from .settings import SCHEDULE_OFF, AppSettings, cron_trigger

log = logging.getLogger("crawler_app.schedule")

#: Id of the scheduler job that runs the application cycle.
JOB_ID = "page-check-cycle"
#: Id of the scheduler job that looks for operators' requests.
REQUEST_JOB_ID = "cycle-requests"
#: Id of the scheduler job that stores the baseline checks of new trackings.
BASELINE_JOB_ID = "baselines"
#: Seconds between two looks for operators' requests (and finished baseline checks).
REQUEST_POLL = 2.0


class CycleScheduler:
    """Runs the application cycle on a cron schedule, once at a time, catching up once."""

    def __init__(
        self,
        engine: Engine,
        run_family: RunFamily,
        settings: AppSettings | None = None,
        timezone: Any = None,
        name: str = "master",
        request_poll: float = REQUEST_POLL,
        leads: Callable[[str], bool] | None = None,
    ) -> None:
        self.engine = engine
        #: Whether this master leads a family: with families spread over several
        #: masters, the one leading the page checks runs the application's cycles.
        self.leads = leads or (lambda _family: True)
        #: Recorded on the requests this scheduler takes.
        self.name = name
        self.request_poll = request_poll
        self.run_family = run_family
        self.settings = settings or AppSettings.from_env()
        self.scheduler = BackgroundScheduler(
            timezone=timezone,
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        #: None when the schedule is off: only requests start cycles.
        self.trigger = (
            None
            if self.settings.schedule == SCHEDULE_OFF
            else cron_trigger(self.settings.schedule, self.scheduler.timezone)
        )
        self._lock = threading.Lock()
        #: Results of the cycles run by this scheduler, oldest first.
        self.results: list[CycleResult] = []

    def _now(self) -> dt.datetime:
        return dt.datetime.now(self.scheduler.timezone)

    def missed(self, now: dt.datetime | None = None) -> bool:
        """True when a cycle is open, or a slot passed since the last cycle started."""
        if open_cycle_step(self.engine) is not None:
            return True
        if self.trigger is None:
            return False
        last = last_cycle_start(self.engine)
        if last is None:
            return True  # never ran: the first slot is now
        now = now or self._now()
        after = last.replace(tzinfo=dt.UTC)
        slot = self.trigger.get_next_fire_time(None, after)
        return slot is not None and slot <= now

    def spread(self, now: dt.datetime | None = None) -> float:
        """Seconds to spread the checks over: the setting, capped at a quarter period."""
        return spread_seconds(self.settings, self.trigger, now or self._now())

    def start(self) -> None:
        """Schedule the cycle (first run now when one was missed) and start the thread."""
        first = self._now() if self.missed() else None
        if self.trigger is not None:
            self.scheduler.add_job(
                self.run_cycle,
                self.trigger,
                id=JOB_ID,
                name="page check cycle",
                next_run_time=first if first is not None else _undefined(),
                replace_existing=True,
            )
        elif first is not None:  # schedule off, but an unfinished cycle resumes
            self.scheduler.add_job(self.run_cycle, id=JOB_ID, name="page check cycle (resumed)")
        self.scheduler.add_job(
            self.serve_requests,
            "interval",
            seconds=self.request_poll,
            id=REQUEST_JOB_ID,
            name="operators' cycle requests",
            replace_existing=True,
            # While a requested cycle runs, the next polls find the lock taken and return
            # at once; with one instance APScheduler would warn of each of them
            # ("maximum number of running instances reached").
            max_instances=2,
        )
        self.scheduler.add_job(
            self.take_baselines,
            "interval",
            seconds=self.request_poll,
            id=BASELINE_JOB_ID,
            name="baselines of new trackings",
            replace_existing=True,
        )
        self.scheduler.start()
        if self.trigger is None:
            log.info("scheduled page-check cycles are off; operators' requests are served")
            return
        job = self.scheduler.get_job(JOB_ID)
        why = ""
        if first is not None:
            # A database where no cycle ever ran missed nothing: its first run is now.
            fresh = last_cycle_start(self.engine) is None
            why = " (the first run)" if fresh else " (catching up a missed run)"
        log.info(
            "page check cycle scheduled (%s), next run %s%s",
            self.settings.schedule,
            job.next_run_time if job else "?",
            why,
        )

    def next_run_time(self) -> dt.datetime | None:
        job = self.scheduler.get_job(JOB_ID)
        return job.next_run_time if job else None

    def serve_requests(self) -> CycleResult | None:
        """Claim pending operators' requests and run one cycle for them all.

        While a cycle runs here the requests are left pending (this job runs
        again in :attr:`request_poll` seconds): they wait for the cycle to end.
        """
        if not self.leads(CHECK_FAMILY) or not self._lock.acquire(blocking=False):
            return None
        try:
            try:
                taken = cycle_requests.claim(self.engine, self.name)
            except SQLAlchemyError:
                log.exception("looking for operators' cycle requests")
                return None
            if not taken:
                return None
            log.info("cycle requested by an operator (requests %s)", taken)
            result = self._run(trigger="web", spread=0.0)
            cycle_requests.settle(self.engine, taken, result.id if result else None)
            return result
        finally:
            self._lock.release()

    def take_baselines(self) -> int:
        """Store the baseline checks of new trackings that finished (their baseline at once)."""
        if not self.leads(CHECK_FAMILY):
            return 0
        try:
            return baselines.apply(self.engine)
        except SQLAlchemyError:
            log.exception("storing baseline checks")
            return 0

    def run_cycle(self, trigger: str = "schedule") -> CycleResult | None:
        """Run (or resume) one application cycle unless one is running in this process,
        or another master leads the page checks (its scheduler runs the cycle)."""
        if not self.leads(CHECK_FAMILY):
            log.info("another master leads the page checks: it runs this slot's cycle")
            return None
        if not self._lock.acquire(blocking=False):
            log.warning("page check cycle still running; this slot is skipped")
            return None
        try:
            return self._run(trigger, self.spread())
        finally:
            self._lock.release()

    def _run(self, trigger: str, spread: float) -> CycleResult | None:
        """The cycle itself, its checks spread over ``spread`` seconds; the caller
        holds the lock."""
        try:
            if open_cycle_step(self.engine) is None and not _anything_tracked(self.engine):
                log.info("no tracked pages: nothing to check in this slot")
                return None
            runner = PageCycle(self.engine, self.run_family, self.settings)
            result = runner.run(trigger=trigger, spread=spread)
            log.info("%s", result.line())
            self.results.append(result)
            return result
        except Exception:
            log.exception("page check cycle failed; it resumes at its step on the next run")
            return None

    def stop(self, wait: bool = False) -> None:
        """Stop firing; ``wait`` for a cycle in progress, else it stays open and resumes
        on the next start."""
        self.scheduler.shutdown(wait=wait)


def spread_seconds(settings: AppSettings, trigger: Any, now: dt.datetime) -> float:
    """Seconds a scheduled cycle starting near ``now`` spreads its checks over:
    ``JODL_CHECK_SPREAD``, capped at a quarter of the time between two slots of
    ``trigger`` (None: the schedule is off, nothing caps it)."""
    if settings.check_spread <= 0:
        return 0.0
    if trigger is None:
        return settings.check_spread
    first = trigger.get_next_fire_time(None, now)
    if first is None:
        return settings.check_spread
    second = trigger.get_next_fire_time(first, first + dt.timedelta(seconds=1))
    if second is None:
        return settings.check_spread
    return max(0.0, min(settings.check_spread, (second - first).total_seconds() / 4))


def next_checks(
    engine: Engine,
    page_ids: Sequence[int],
    settings: AppSettings | None = None,
    now: dt.datetime | None = None,
    timezone: Any = None,
) -> dict[int, dt.datetime]:
    """When the schedule next checks each of these pages (aware datetimes in
    ``timezone``, by default the local one: the scheduler's, cron fields are local time).

    A page checked every N-th cycle (its period) waits for the slot where N cycles
    have passed since its last check; its check starts at its place in that slot's
    spread. Pages without a schedule (``JODL_SCHEDULE=off``) or without a job are
    left out. Cycles operators start add checks the schedule does not foresee.
    """
    settings = settings or AppSettings.from_env()
    if settings.schedule == SCHEDULE_OFF or not page_ids:
        return {}
    from tzlocal import get_localzone

    zone = timezone or get_localzone()
    trigger = cron_trigger(settings.schedule, zone)
    now = now.astimezone(zone) if now is not None else dt.datetime.now(zone)
    reads = Reads(engine)
    latest = reads.newest_run_number(CHECK_FAMILY)
    with engine.connect() as conn:
        pages = conn.execute(
            select(Page.id, Page.url, Page.job_id).where(
                Page.id.in_(list(page_ids)), Page.job_id.is_not(None)
            )
        ).all()
    # A job that failed or runs now is back in line for the next cycle anyway.
    timings = reads.job_timings([job_id for _, _, job_id in pages])
    rows = [
        (page_id, url, timings[job_id].every_n_cycles, timings[job_id].last_run_number)
        for page_id, url, job_id in pages
        if job_id in timings
    ]
    slots: list[dt.datetime] = []
    spreads: dict[int, float] = {}  # slot index -> seconds its checks spread over
    out: dict[int, dt.datetime] = {}
    for page_id, url, every, last in rows:
        wait = 1 if last is None or latest is None else max(1, last + (every or 1) - latest)
        while len(slots) < wait:
            previous = slots[-1] if slots else None
            after = previous + dt.timedelta(microseconds=1) if previous else now
            slot = trigger.get_next_fire_time(previous, after)
            if slot is None:
                break
            slots.append(slot)
        if len(slots) < wait:
            continue
        slot = slots[wait - 1]
        if wait not in spreads:
            spreads[wait] = spread_seconds(settings, trigger, slot)
        out[page_id] = slot + dt.timedelta(seconds=spread_fraction(url) * spreads[wait])
    return out


def _anything_tracked(engine: Engine) -> bool:
    with engine.connect() as conn:
        # Paused trackings ask for no check.
        return bool(conn.scalar(select(exists().where(Tracking.paused.is_(False)))))


def _undefined() -> Any:
    from apscheduler.util import undefined

    return undefined


class MasterRunner:
    """Runs a family's cycle on a serving master from another thread, until stopped."""

    def __init__(self, master: Any) -> None:
        self.master = master
        self.stopped = threading.Event()

    def __call__(self, family: str) -> Any:
        future: Future[Any] = self.master.request_cycle(family)
        while True:
            try:
                return future.result(timeout=0.5)
            except FutureTimeout:
                if self.stopped.is_set():
                    raise JodlError(f"the master stopped while the {family} cycle ran") from None


def start(master: Any, library_settings: Any = None) -> Callable[[], None]:
    """Entry point ``jodl.services``: schedule page-check cycles on a serving master.

    Returns the function that stops the scheduler.
    """
    settings = AppSettings.from_env()
    runner = MasterRunner(master)
    name = str(getattr(master, "name", None) or "master")
    leads = getattr(master, "leads", None)
    scheduler = CycleScheduler(master.store.engine, runner, settings, name=name, leads=leads)
    try:
        scheduler.start()
    except SQLAlchemyError as exc:
        # The master serves the library's families even when the page checker's
        # tables are missing; say what to do instead of failing the whole master.
        reason = str(exc).strip().splitlines()[0]
        log.error("page-check cycles not scheduled (run `jodl db upgrade`?): %s", reason)
        return lambda: None

    def stop() -> None:
        runner.stopped.set()
        scheduler.stop()

    return stop
