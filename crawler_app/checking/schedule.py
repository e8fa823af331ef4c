"""Scheduled application cycles beside a serving master (``jodl master``).

An APScheduler ``BackgroundScheduler`` starts page-check cycles; each checks the
pages due by their trackings' schedules (:mod:`crawler_app.checking.due`, docs/schedules.md):

* a **tick** every ``JODL_CHECK_TICK`` seconds, on a fixed grid, starts a cycle when
  some page's due time has passed (one look at the library's index), else nothing;
* the cron expression ``JODL_SCHEDULE`` (five fields, local time; a sixth leading
  field gives seconds; ``off`` turns it off), the default schedule of trackings
  without one, fires a cycle at its slots too.

The cycle runs in the scheduler's thread; its two job steps ask the serving master
(single-threaded) to run a JODL cycle with ``Master.request_cycle`` and wait for it.
A slot with no tracked page (paused trackings do not count) and no unfinished cycle
does nothing.

* One cycle at a time: the job has ``max_instances=1`` and a lock guards the
  cycle; at most one application cycle is open in the database anyway.
* Slots missed while the master was down run **once** at start, not once per
  missed slot: the database says when the last cycle started; if a slot fell
  between then and now (or a cycle is still open) the job's first run is now.
  ``coalesce`` folds slots missed while a long cycle ran into one run.
* The checks of a scheduled cycle start spread over ``JODL_CHECK_SPREAD``
  seconds by a hash of the URL, never more than a quarter of the time to the
  next slot nor of the shortest interval among the due pages (:func:`due_spread`).
  A cycle an operator asked for is not spread: someone is waiting for it, and
  spreading exists to smooth the load of the scheduled checks.
* :func:`next_checks` tells the web UI when a page is next checked (its job's due time).
* Operators' requests for a cycle now (:mod:`crawler_app.checking.cycle_requests`) are
  looked for every :data:`REQUEST_POLL` seconds by an interval job, also with
  ``JODL_SCHEDULE=off``. A request waits while a cycle runs; all requests
  pending when the cycle ends are served by one cycle (trigger ``web``).
* Baseline checks of new trackings (:mod:`crawler_app.checking.baselines`) are stored
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
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import sessionmaker

from jodl.exceptions import JodlError
from jodl.log import Reads, utcnow

from ..settings import SCHEDULE_OFF, AppSettings, cron_trigger
from ..users.pages import CHECK_FAMILY, sync_jobs
from . import baselines, cycle_requests, queries
from .cycle import CycleResult, PageCycle, RunFamily
from .due import Clock, Schedule, local_zone, shortest_interval

log = logging.getLogger("crawler_app.schedule")

#: Id of the scheduler job that runs the application cycle.
JOB_ID = "page-check-cycle"
#: Id of the scheduler job that starts a cycle when a page is due.
TICK_JOB_ID = "due-pages"
#: Where the ticks' grid starts: ticks fire at whole multiples of the tick since then
#: (whole minutes for 60 s), so a page's due time, counted from a tick, falls on one.
TICK_ORIGIN = dt.datetime(2000, 1, 1, tzinfo=dt.UTC)
#: Id of the scheduler job that looks for operators' requests.
REQUEST_JOB_ID = "cycle-requests"
#: Id of the scheduler job that stores the baseline checks of new trackings.
BASELINE_JOB_ID = "baselines"
#: Seconds between two looks for operators' requests (and finished baseline checks).
REQUEST_POLL = 2.0


class CycleScheduler:
    """Runs the application cycle when pages are due and on the default cron schedule,
    once at a time, catching up once."""

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
        if queries.open_cycle_step(self.engine) is not None:
            return True
        if self.trigger is None:
            return False
        last = queries.last_cycle_start(self.engine)
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
        """Schedule the cycle (first run now when one was missed), the tick and the
        requests' poll, and start the thread."""
        first = self._now() if self.missed() else None
        refresh_due_times(self.engine, self.settings)
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
            self.tick,
            "interval",
            seconds=self.settings.check_tick,
            start_date=TICK_ORIGIN,
            id=TICK_JOB_ID,
            name="cycle of the due pages",
            replace_existing=True,
            # As for requests: a tick that finds a cycle running returns at once.
            max_instances=2,
        )
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
            fresh = queries.last_cycle_start(self.engine) is None
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

    def due(self, now: dt.datetime | None = None) -> bool:
        """True when some page's due time has passed (naive UTC ``now``): one look at
        the library's index of idle jobs' due times."""
        when = Reads(self.engine).next_due(CHECK_FAMILY)
        return when is not None and when <= (now or utcnow())

    def tick(self, now: dt.datetime | None = None) -> CycleResult | None:
        """Every ``JODL_CHECK_TICK`` seconds: a cycle of the due pages when some page is
        due (or a cycle is open); nothing otherwise, not even a cycle row."""
        if not self.leads(CHECK_FAMILY):
            return None
        try:
            if queries.open_cycle_step(self.engine) is None and not self.due(now):
                return None
        except SQLAlchemyError:
            log.exception("looking for due pages")
            return None
        if not self._lock.acquire(blocking=False):
            return None  # a cycle runs: it takes what is due when its run opens
        try:
            return self._run("schedule", due_spread(self.engine, self.settings, self.spread()))
        finally:
            self._lock.release()

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
            return self._run(trigger, due_spread(self.engine, self.settings, self.spread()))
        finally:
            self._lock.release()

    def _run(self, trigger: str, spread: float) -> CycleResult | None:
        """The cycle itself, its checks spread over ``spread`` seconds; the caller
        holds the lock."""
        try:
            if queries.open_cycle_step(self.engine) is None and not queries.anything_tracked(
                self.engine
            ):
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
    now: dt.datetime | None = None,
    timezone: Any = None,
) -> dict[int, dt.datetime]:
    """When each of these pages is next checked: its job's due time (the earliest among
    its active trackings', :mod:`crawler_app.checking.due`), or ``now`` when that has passed
    (the next tick takes it); aware datetimes in ``timezone``, by default the local one.

    Pages without a job (untracked, all trackings paused) or without a due time
    (``JODL_SCHEDULE=off`` and no schedule of their own: checked by whatever cycle
    runs) are left out. The check itself starts within the cycle's spread.
    """
    if not page_ids:
        return {}
    zone = timezone or local_zone()
    now = now.astimezone(dt.UTC) if now is not None else dt.datetime.now(dt.UTC)
    with engine.connect() as conn:
        pages = queries.jobs_of_pages(conn, list(page_ids))
    dues = Reads(engine).due_times([job_id for _, job_id in pages])
    out: dict[int, dt.datetime] = {}
    for page_id, job_id in pages:
        due = dues.get(job_id)
        if due is not None:
            out[page_id] = max(due.replace(tzinfo=dt.UTC), now).astimezone(zone)
    return out


def due_spread(
    engine: Engine, settings: AppSettings, cap: float, now: dt.datetime | None = None
) -> float:
    """Seconds a cycle of the pages due at ``now`` (naive UTC) spreads their checks over:
    ``cap`` (``JODL_CHECK_SPREAD``, itself capped by the default schedule), and never
    more than a quarter of the shortest interval among the due pages' active trackings,
    so a 15-minute page is not started up to five minutes late."""
    if cap <= 0:
        return 0.0
    now = now or utcnow()
    with engine.connect() as conn:
        pages = queries.pages_by_job(conn)
        dues = Reads(engine).due_times(list(pages))
        due_pages = [pages[j] for j, when in dues.items() if when is None or when <= now]
        schedules: dict[int, list[Schedule]] = {}
        for page_id, every, cron in queries.active_schedules(conn, due_pages):
            schedules.setdefault(page_id, []).append(Schedule(every, cron))
    shortest = shortest_interval(Clock(settings), schedules, now)
    return cap if shortest is None else max(0.0, min(cap, shortest / 4))


def refresh_due_times(engine: Engine, settings: AppSettings) -> int:
    """Every tracked page's due time from its trackings now (at start: a database
    upgraded from before schedules, or a changed ``JODL_SCHEDULE``); pages with a job."""
    with sessionmaker(engine)() as s, s.begin():
        return sync_jobs(s, settings=settings)


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
