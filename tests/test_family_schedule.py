"""A family's cron schedule honoured by a real ``jodl master`` (seconds in the cron line)."""

from __future__ import annotations

import logging
import signal
import time
from pathlib import Path

from agents import run_jodl, spawn_jodl, wait_for
from sqlalchemy import select, update

from jodl.admin.schedule import RELOAD, FamilySchedules
from jodl.log import Store
from jodl.log.models import FamilyRow, Run, RunState
from jodl.master import Master


def finished_runs(store: Store, family: str) -> list[Run]:
    with store.session() as s:
        return list(
            s.scalars(
                select(Run)
                .join(FamilyRow, FamilyRow.id == Run.family_id)
                .where(FamilyRow.name == family, Run.state == RunState.FINISHED)
                .order_by(Run.number)
            )
        )


def test_master_runs_a_cycle_at_each_cron_time(store, agents, tmp_path: Path) -> None:
    agents(1, slots=2)
    fam = store.ensure_family("noop")
    store.add_jobs(fam, [(f"k{i}", "{}") for i in range(3)])
    url = store.engine.url.render_as_string(False)
    env = {"JODL_DATABASE_URL": url, "JODL_METRICS_LISTEN": ""}
    # Every second second; set while no master runs.
    done = run_jodl("family", "set", "noop", "--schedule", "*/2 * * * * *", env=env)
    assert done.returncode == 0, done.stderr
    log = tmp_path / "master.log"
    master = spawn_jodl("master", log_path=log, env=env)
    try:
        wait_for(lambda: len(finished_runs(store, "noop")) >= 3, 60, "three scheduled cycles")
        runs = finished_runs(store, "noop")
        assert all(r.jobs_done == 3 and r.jobs_dead == 0 for r in runs)
        starts = [r.started_at for r in runs]
        # One cycle per slot: slots are two seconds apart, cycles of 3 no-ops take far less.
        gaps = [(b - a).total_seconds() for a, b in zip(starts, starts[1:], strict=False)]
        assert all(gap > 1.0 for gap in gaps), gaps
        # Turned off while the master runs: no cycle starts once it has read the change.
        off = run_jodl("family", "set", "noop", "--schedule", "off", env=env)
        assert off.returncode == 0, off.stderr
        time.sleep(RELOAD + 2.5)  # the change is read, a cycle started before it ends
        settled = len(finished_runs(store, "noop"))
        time.sleep(4.5)  # two slots of the old schedule: nothing may start in them
        assert len(finished_runs(store, "noop")) == settled
        with store.session() as s:
            assert not s.scalar(select(Run.id).where(Run.state == RunState.RUNNING))
    finally:
        master.send_signal(signal.SIGTERM)
        code = master.wait(timeout=30)
    assert code == 0, log.read_text()


def test_a_bad_stored_schedule_is_said_once_and_skipped(store, settings, caplog) -> None:
    good = store.ensure_family("noop")
    store.ensure_family("sleep")
    with store.engine.begin() as conn:  # written past the checks (e.g. by SQL)
        conn.execute(
            update(FamilyRow).where(FamilyRow.name == "sleep").values(schedule="61 * * * *")
        )
        conn.execute(update(FamilyRow).where(FamilyRow.id == good.id).values(schedule="0 6 * * *"))
    schedules = FamilySchedules(Master(settings, store=store))
    caplog.set_level(logging.INFO, logger="jodl.schedule")
    schedules.sync()
    schedules.sync()
    assert schedules.active == {"noop": "0 6 * * *"}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "sleep" in warnings[0].getMessage()
    job = schedules.scheduler.get_job("family:noop")
    assert job is not None and "hour='6'" in str(job.trigger)
    with store.engine.begin() as conn:
        conn.execute(update(FamilyRow).values(schedule=None))
    schedules.sync()
    assert schedules.active == {} and schedules.scheduler.get_job("family:noop") is None
