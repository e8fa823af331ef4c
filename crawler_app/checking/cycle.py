"""The page checker's cycle as a recorded state machine (docs/architecture.md#the-applications).

::

    prepare                jobs in line with the trackings; payloads carry validators,
                           each view's baseline and model, (scheduled cycles) start times
    check                  one JODL cycle of ``check_page`` on the agents (a page that
                           differs is fetched again in the same job to confirm it)
    analyse                verdicts -> views, snapshots, pages
                           (:mod:`crawler_app.checking.analysis`)
    prepare_notifications  one digest per user with confirmed changes: a row with an
                           idempotency key and a ``notify`` job, committed together
                           (:mod:`crawler_app.notify.digests`)
    send                   one JODL cycle of ``notify`` (agents send over SMTP); outcomes
    finish                 snapshot retention, counts, the cycle closed

The step reached is committed in :class:`~crawler_app.models.AppCycle` after each
step's work, and every step can be redone: a process killed anywhere starts the
same cycle again at the recorded step. The JODL run of each of the two job steps
is opened and recorded *before* it runs, so a restart resumes that run (the
library redoes only jobs without a committed result) instead of opening another.
At most one cycle is open (a unique index); starting a cycle resumes the open one.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from jodl import failpoint
from jodl.log import Run, RunState, Store, utcnow

from ..fetching.reach import Reach, allowlisted_pages
from ..models import WHOLE_PAGE, AppCycle, CycleStep
from ..notify import digests
from ..settings import AppSettings
from ..users.pages import CHECK_FAMILY, NOTIFY_FAMILY, check_payload, family_id, sync_jobs
from . import baselines, queries
from .analysis import apply_chunk
from .due import floor_to_tick

log = logging.getLogger("crawler_app.cycle")

#: Trigger of a one-shot cycle (`jodl cycle` with no master running): it checks every
#: tracked page, due or not; the others check the pages due.
EVERY_PAGE_TRIGGER = "command"
#: Check results applied per transaction in the analyse step.
ANALYSE_CHUNK = 500

#: Runs one JODL cycle of the named family to its end (e.g. ``Master.run_cycle``).
RunFamily = Callable[[str], Any]
#: Told the step being started (for progress displays).
OnStep = Callable[[str], None]


@dataclass
class CycleResult:
    """What one application cycle did (also stored in its :class:`AppCycle` row)."""

    id: int
    resumed: bool
    pages: int
    checked: int
    not_modified: int
    errors: int
    changed: int
    notifications: int
    sent: int
    elapsed: float

    def line(self) -> str:
        return (
            f"cycle {self.id}{' (resumed)' if self.resumed else ''}: {self.checked}/{self.pages}"
            f" pages checked ({self.not_modified} not modified, {self.errors} errors), "
            f"{self.changed} changed, {self.sent}/{self.notifications} digests sent, "
            f"{self.elapsed:.1f}s"
        )


def spread_fraction(url: str) -> float:
    """A stable number in [0, 1) from the URL: where in the spread window its check starts."""
    return int.from_bytes(hashlib.sha256(url.encode("utf-8")).digest()[:8], "big") / 2**64


def _unix(when: dt.datetime) -> float:
    return when.replace(tzinfo=dt.UTC).timestamp()


class PageCycle:
    """Runs (or resumes) application cycles on one database.

    ``run_family`` runs a JODL cycle of a family to its end: ``master.run_cycle``
    in a one-shot process, or ``lambda f: master.request_cycle(f).result()`` beside
    a serving master.
    """

    def __init__(
        self,
        engine: Engine,
        run_family: RunFamily,
        settings: AppSettings | None = None,
        on_step: OnStep | None = None,
    ) -> None:
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)
        self.run_family = run_family
        self.settings = settings or AppSettings.from_env()
        self.on_step = on_step
        self.store = Store(engine)

    # -- the state machine ---------------------------------------------------------------

    def run(self, trigger: str = "command", spread: float = 0.0) -> CycleResult:
        """Run one application cycle: resume the open one, or start a new one."""
        started = time.perf_counter()
        cycle, resumed = self.open_cycle(trigger, spread)
        if resumed:
            log.info("resuming cycle %d at step %s", cycle.id, cycle.step)
        steps: dict[str, Callable[[AppCycle], None]] = {
            CycleStep.PREPARE: self.prepare,
            CycleStep.CHECK: self.check,
            CycleStep.ANALYSE: self.analyse,
            CycleStep.PREPARE_NOTIFICATIONS: self.prepare_notifications,
            CycleStep.SEND: self.send,
            CycleStep.FINISH: self.finish,
        }
        while cycle.step != CycleStep.DONE:
            step = cycle.step
            if self.on_step is not None:
                self.on_step(step)
            t0 = time.perf_counter()
            steps[step](cycle)
            failpoint.hit(f"app_{step}")  # work done, step not recorded: a restart redoes it
            cycle = self._advance(cycle.id, step, time.perf_counter() - t0)
        return CycleResult(
            cycle.id,
            resumed,
            cycle.pages,
            cycle.checked,
            cycle.not_modified,
            cycle.errors,
            cycle.changed,
            cycle.notifications,
            cycle.sent,
            time.perf_counter() - started,
        )

    def open_cycle(self, trigger: str = "command", spread: float = 0.0) -> tuple[AppCycle, bool]:
        """The open cycle (resumed: True), or a new one at step ``prepare``."""
        for _ in range(3):
            with self.sessions() as s, s.begin():
                cycle = queries.open_cycle(s)
                if cycle is not None:
                    return cycle, True
            try:
                with self.sessions() as s, s.begin():
                    now = utcnow()
                    cycle = AppCycle(
                        step=CycleStep.PREPARE,
                        is_open=True,
                        trigger=trigger,
                        spread=spread,
                        started_at=now,
                        step_started_at=now,
                        timings={},
                    )
                    s.add(cycle)
                    s.flush()
                    return cycle, False
            except IntegrityError:
                continue  # another process opened one meanwhile: resume that
        raise RuntimeError("could not open an application cycle")

    def _advance(self, cycle_id: int, step: str, seconds: float) -> AppCycle:
        following = CycleStep.ORDER[CycleStep.ORDER.index(step) + 1]
        with self.sessions() as s, s.begin():
            cycle = s.get(AppCycle, cycle_id, with_for_update=True)
            assert cycle is not None
            if cycle.step != step:
                return cycle  # someone else advanced it
            cycle.timings = {**(cycle.timings or {}), step: round(seconds, 3)}
            cycle.step = following
            cycle.step_started_at = utcnow()
            if following == CycleStep.DONE:
                cycle.finished_at = utcnow()
                cycle.is_open = None
            return cycle

    # -- prepare ---------------------------------------------------------------------------

    def prepare(self, cycle: AppCycle) -> None:
        """Jobs in line with trackings; each payload gets validators, known fingerprints
        and, for a spread cycle, its start time and an ordering priority.

        Baseline checks finished since the last look are stored first, and views
        kept from before models were learned get one (:mod:`crawler_app.checking.baselines`)."""
        baselines.apply(self.engine)
        with self.sessions() as s, s.begin():
            family_id(s, NOTIFY_FAMILY)
            # A one-shot cycle (`jodl cycle` with no master running) checks every page;
            # scheduled and requested ones the pages due (docs/schedules.md).
            every_page = cycle.trigger == EVERY_PAGE_TRIGGER
            live = sync_jobs(s, settings=self.settings, every_page=every_page)
            fid = family_id(s, CHECK_FAMILY)
            idle = self.store.reads.idle_jobs(fid, s.connection())
            pages = [row for row in queries.pages_with_jobs(s) if row.job_id in idle]
            wanted = queries.wanted_views(s)
            known: dict[tuple[int, str], dict[str, Any]] = {}
            migrated: list[tuple[int, int, str, str]] = []
            for view_id, page_id, selector, fp, recent, model in queries.view_states(s):
                if fp is None:
                    continue
                if not model:
                    migrated.append((view_id, page_id, selector, fp))
                known[(page_id, selector)] = {"known": [fp, *(recent or [])], "model": model}
            for view, model in baselines.adopt_migrated(s, migrated).items():
                known[view]["model"] = model
            known = {view: state for view, state in known.items() if state["model"]}
            start = _unix(cycle.started_at)
            # One fetch serves all of a page's trackers: it may use the allowlist when
            # one of them may (crawler_app.fetching.reach).
            allowlisted = allowlisted_pages(s, self.settings.allow_users())
            rows = []
            for page_id, url, job_id, etag, last_modified, browser in pages:
                views: dict[str, dict[str, Any]] = {}
                every_view_known = True
                for selector in sorted(wanted.get(page_id, {WHOLE_PAGE})):
                    state = known.get((page_id, selector))
                    views[selector] = state or {"known": []}
                    every_view_known &= state is not None
                reach = Reach.ALLOWLIST if page_id in allowlisted else Reach.PUBLIC
                payload = check_payload(url, browser, views, reach)
                # A 304 tells nothing about a view never seen: fetch in full then. A
                # rendered page's text depends on more than its document: never a 304.
                if every_view_known and not browser:
                    if etag:
                        payload["etag"] = etag
                    if last_modified:
                        payload["last_modified"] = last_modified
                priority = 0
                if cycle.spread > 0:
                    fraction = spread_fraction(url)
                    payload["start_at"] = round(start + fraction * cycle.spread, 3)
                    priority = -int(fraction * 1_000_000)  # earliest start sent first
                rows.append({"id": job_id, "payload": json.dumps(payload), "priority": priority})
            self.store.set_payloads(rows, s.connection())
            s.get(AppCycle, cycle.id).pages = live  # type: ignore[union-attr]
            cycle.pages = live

    # -- the two JODL cycles -----------------------------------------------------------------

    def _family_run(self, cycle: AppCycle, family: str, field: str) -> Run:
        """Open (or find the recorded) JODL run of ``family`` for this cycle and run it."""
        run_id = getattr(cycle, field)
        if run_id is None:
            fam = self.store.family(family)
            assert fam is not None, f"family {family} is created in the prepare step"
            run, _ = self.store.open_run(fam, 0)
            with self.sessions() as s, s.begin():
                row = s.get(AppCycle, cycle.id)
                assert row is not None
                setattr(row, field, run.id)
            setattr(cycle, field, run.id)
            run_id = run.id
            failpoint.hit(f"app_{family}_opened")
        run = self.store.reads.run(run_id)
        assert run is not None
        if run.state == RunState.RUNNING:
            self.run_family(family)
            run = self.store.reads.run(run_id)
            assert run is not None
        return run

    def check(self, cycle: AppCycle) -> None:
        """One JODL cycle of ``check_page``: every due page fetched once, on the agents."""
        self._family_run(cycle, CHECK_FAMILY, "check_run_id")

    # -- analyse ----------------------------------------------------------------------------

    def analyse(self, cycle: AppCycle) -> None:
        """Apply every check result of the cycle's run to its page and views.

        In chunks, one transaction each; a page marks the cycle it was analysed
        for, so a redone step skips what was already applied (counts included).
        """
        run_id = cycle.check_run_id
        if run_id is None:
            return
        last = 0
        while True:
            with self.sessions() as s, s.begin():
                rows = self.store.reads.results_since(run_id, last, ANALYSE_CHUNK, s.connection())
                if not rows:
                    break
                last = rows[-1].exec_id
                apply_chunk(s, cycle.id, rows)
        with self.sessions() as s, s.begin():
            # Jobs that failed every attempt: the page records why (never a change).
            errors = self.store.reads.dead_in_run(run_id, s.connection())
            dead = [
                (page, errors[page.job_id])
                for page in queries.pages_of_jobs(s, list(errors))
                if page.job_id is not None
            ]
            for page, error in dead:
                if page.analysed_cycle_id != cycle.id:
                    page.analysed_cycle_id = cycle.id
                    page.last_error = f"internal_error: {error}"
                    page.last_checked_at = utcnow()
                    row = s.get(AppCycle, cycle.id)
                    assert row is not None
                    row.errors += 1
            # The pages this cycle checked are next due a whole interval (or their next
            # cron time) after the tick that started it; all jobs get their due times.
            slot_at = floor_to_tick(cycle.started_at, self.settings.check_tick)
            queries.set_slot_of_analysed(s, cycle.id, slot_at)
            sync_jobs(s, settings=self.settings)

    # -- notifications ------------------------------------------------------------------------

    def prepare_notifications(self, cycle: AppCycle) -> None:
        """One digest per user tracking a view that changed in this cycle.

        The notification row (with its idempotency key) and its ``notify`` job are
        committed in one transaction; a redone step skips users that have one.
        """
        with self.sessions() as s, s.begin():
            digests.prepare(s, cycle, self.settings)

    def send(self, cycle: AppCycle) -> None:
        """One JODL cycle of ``notify``, then each digest's outcome is recorded.

        Sent digests' jobs end as ``done`` so no later ``notify`` cycle runs them again.
        """
        with self.sessions() as s:
            prepared = digests.pending(s, cycle.id)
        if not prepared:
            return
        run = self._family_run(cycle, NOTIFY_FAMILY, "notify_run_id")
        failpoint.hit("app_send_ran")
        with self.sessions() as s, s.begin():
            digests.record_outcomes(s, cycle.id, run.id)

    # -- finish --------------------------------------------------------------------------------

    def finish(self, cycle: AppCycle) -> None:
        """Keep the newest ``JODL_SNAPSHOT_RETENTION`` snapshots of every view touched
        (:func:`~crawler_app.checking.queries.trim_snapshots`)."""
        with self.sessions() as s, s.begin():
            queries.trim_snapshots(s, cycle.id, self.settings.snapshot_retention)
