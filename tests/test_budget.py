"""Per-family budgets on real agents: jobs per cycle, on-demand jobs per hour, bytes per cycle.

Each budget holds back the first job over it, and nothing is lost: the jobs it put
off run in the next cycle (or the next hour), the run records how many, and the
metrics count it.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from app_support import add_users_tracking, agent_env, run_app_cycle
from click.testing import CliRunner
from prometheus_client import REGISTRY
from sqlalchemy import func, select

from jodl.admin.budget import Budgets, Limits
from jodl.cli import main
from jodl.log import Store
from jodl.log.models import ExecState, Execution, Job, Run
from jodl.master import Master
from jodl.queue import Queue

pytest_plugins = ("tests.site",)


def add_jobs(store: Store, family: str, count: int, payload: str = "{}") -> None:
    fam = store.ensure_family(family)
    store.add_jobs(fam, ((f"{family}-{i:03d}", payload) for i in range(count)))


def done_keys(store: Store, run_id: int) -> list[str]:
    with store.engine.connect() as conn:
        return sorted(
            conn.scalars(
                select(Job.key)
                .join(Execution, Execution.job_id == Job.id)
                .where(Execution.run_id == run_id, Execution.state == ExecState.DONE)
            )
        )


def metric(name: str, family: str, budget: str) -> float:
    return REGISTRY.get_sample_value(name, {"family": family, "budget": budget}) or 0.0


def jodl(store: Store, *args: str) -> Any:
    url = store.engine.url.render_as_string(hide_password=False)
    return CliRunner().invoke(main, ["--database-url", url, *args])


@pytest.fixture(autouse=True)
def no_default_budgets(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "JODL_FAMILY_JOBS_PER_CYCLE",
        "JODL_FAMILY_ONDEMAND_PER_HOUR",
        "JODL_FAMILY_BYTES_PER_CYCLE",
    ):
        monkeypatch.delenv(name, raising=False)


# -- jobs per cycle ---------------------------------------------------------------------------


def test_jobs_per_cycle_defers_the_rest_oldest_due_first(store, agents, settings) -> None:
    add_jobs(store, "noop", 10)
    r = jodl(store, "budget", "set", "noop", "--jobs-per-cycle", "4")
    assert r.exit_code == 0, r.output
    assert r.output.strip() == (
        "noop: jobs per cycle 4, on-demand per hour no limit, bytes per cycle no limit"
    )
    agents(1, slots=2)
    deferred_before = metric("jodl_jobs_deferred_total", "noop", "jobs_per_cycle")
    master = Master(settings, store=store)
    try:
        runs = [master.run_cycle("noop") for _ in range(3)]
    finally:
        master.close()
    assert [(s.total, s.done) for s in runs] == [(4, 4)] * 3
    keys = [done_keys(store, s.run_id) for s in runs]
    every = [f"noop-{i:03d}" for i in range(10)]
    # The first cycle runs the first four; the next one the four that waited longest
    # (never run); the third the last two never run, then the two oldest of the first.
    assert keys[0] == every[:4]
    assert keys[1] == every[4:8]
    assert keys[2] == sorted(every[8:] + every[:2])
    with store.session() as s:
        deferred = [s.get(Run, x.run_id).deferred for x in runs]  # type: ignore[union-attr]
    assert deferred == [6, 6, 6]
    assert metric("jodl_jobs_deferred_total", "noop", "jobs_per_cycle") == deferred_before + 18
    # Without a budget the next cycle runs every job again.
    assert jodl(store, "budget", "set", "noop", "--jobs-per-cycle", "default").exit_code == 0
    master = Master(settings, store=store)
    try:
        assert master.run_cycle("noop").done == 10
    finally:
        master.close()


def test_a_cut_run_has_the_same_members_when_resumed(store) -> None:
    add_jobs(store, "noop", 7)
    Budgets(store.engine).set("noop", jobs_per_cycle=3)
    family = store.family("noop")
    run, resumed = store.open_run(family, 1)
    assert not resumed and (run.jobs_total, run.deferred) == (3, 4)
    first = sorted(j.key for j in store.run_jobs(run, "noop"))
    # Jobs added after the run opened wait for the next run, as always.
    add_jobs(store, "noop", 9)
    again, resumed = store.open_run(family, 2)
    assert resumed and again.id == run.id
    assert (
        sorted(j.key for j in store.run_jobs(again, "noop"))
        == first
        == [
            "noop-000",
            "noop-001",
            "noop-002",
        ]
    )


def test_budget_command_refuses_bad_input_and_changes_nothing(store) -> None:
    add_jobs(store, "noop", 1)
    for args, said in (
        (["--jobs-per-cycle", "-1"], "negative"),
        (["--bytes-per-cycle", "lots"], "not a whole number"),
        ([], "give at least one of"),
    ):
        r = jodl(store, "budget", "set", "noop", *args)
        assert r.exit_code == 2 and said in r.output, r.output
    r = jodl(store, "budget", "set", "nosuch", "--jobs-per-cycle", "3")
    assert r.exit_code == 1
    assert r.output.strip() == "error: no family 'nosuch' (families: noop)"
    r = jodl(store, "budget", "show")
    assert r.exit_code == 0
    assert r.output.strip() == (
        "noop: jobs per cycle no limit, on-demand per hour no limit, bytes per cycle no limit"
    )


def test_defaults_come_from_the_settings(store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JODL_FAMILY_JOBS_PER_CYCLE", "2")
    assert Limits.defaults().jobs_per_cycle == 2
    add_jobs(store, "noop", 5)
    run, _ = store.open_run(store.family("noop"), 1)
    assert (run.jobs_total, run.deferred) == (2, 3)
    # A family's own budget wins; 0 is no limit.
    Budgets(store.engine).set("noop", jobs_per_cycle=0)
    with store.engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(Job)) == 5


# -- on-demand jobs per hour ------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = dt.datetime(2026, 11, 22, 15, 10)

    def __call__(self) -> dt.datetime:
        return self.now


def test_ondemand_per_hour_keeps_the_rest_queued_until_the_next_hour(store) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    queue.enqueue_many("noop", [(f"n{i}", {}) for i in range(5)])
    queue.enqueue_many("mark", [(f"m{i}", {}) for i in range(4)])
    r = jodl(store, "budget", "set", "noop", "--ondemand-per-hour", "3")
    assert r.exit_code == 0, r.output
    exhausted = metric("jodl_budget_exhausted_total", "noop", "ondemand_per_hour")
    # The first claim takes 3 of noop and every job of a family without a budget.
    first = queue.claim(20)
    assert sorted(c.key for c in first if c.family == "noop") == ["n0", "n1", "n2"]
    assert sorted(c.key for c in first if c.family == "mark") == ["m0", "m1", "m2", "m3"]
    assert metric("jodl_budget_exhausted_total", "noop", "ondemand_per_hour") == exhausted + 1
    # Within the hour: nothing more of noop, however the claim asks; not lost, queued.
    clock.now += dt.timedelta(minutes=49)
    assert queue.claim(20) == []
    assert queue.claim(1, families=["noop"]) == []
    assert queue.counts("noop")["noop"]["queued"] == 2
    # The next hour: the rest.
    clock.now += dt.timedelta(minutes=2)
    assert sorted(c.key for c in queue.claim(20)) == ["n3", "n4"]
    assert queue.counts("noop")["noop"].get("queued", 0) == 0


def test_ondemand_budget_counts_claims_one_at_a_time(store) -> None:
    clock = Clock()
    queue = Queue(store, clock=clock)
    queue.enqueue_many("noop", [(f"n{i}", {}) for i in range(6)])
    Budgets(store.engine).set("noop", ondemand_per_hour=4)
    got = [len(queue.claim(3)) for _ in range(3)]
    assert got == [3, 1, 0]
    # Another queue object (another master) shares the count in the database.
    other = Queue(store, clock=clock)
    assert other.claim(5) == []


# -- bytes per cycle -----------------------------------------------------------------------------

PAGE_BYTES = 1000


def page_of(size: int, n: int) -> str:
    head = f"<html><head><title>page {n}</title></head><body><p>"
    tail = "</p></body></html>"
    return head + "x" * (size - len(head) - len(tail)) + tail


def test_bytes_budget_stops_a_check_cycle_and_the_rest_go_first_next_cycle(
    store, agents, settings, site
) -> None:
    paths = [f"/p{i}" for i in range(10)]
    for n, path in enumerate(paths):
        # Slow enough that the agent (one async slot) is sent two checks at a time.
        site.set_page(path, page_of(PAGE_BYTES, n), delay=0.2)
    users = ["ann@example.org"]
    for path in paths:
        add_users_tracking(store, site.url(path), users)
    env = {**agent_env(), "JODL_AGENT_ASYNC_SLOTS": "1"}
    agents(1, slots=1, env=env)
    fam = store.ensure_family("check_page")
    assert fam is not None
    r = jodl(store, "budget", "set", "check_page", "--bytes-per-cycle", str(3 * PAGE_BYTES))
    assert r.exit_code == 0, r.output
    exhausted = metric("jodl_budget_exhausted_total", "check_page", "bytes_per_cycle")
    deferred = metric("jodl_jobs_deferred_total", "check_page", "bytes_per_cycle")

    first = run_app_cycle(store, settings)
    fetched = {p for p in paths if site.requests(p)}
    # A new page's baseline may take a confirming fetch: counted per page, not as one.
    asked = {p: len(site.requests(p)) for p in fetched}
    # Three results reach the budget; what was in flight then (two at most) finishes.
    assert 3 <= first.checked <= 5 and len(fetched) == first.checked
    with store.session() as s:
        run = s.scalar(select(Run).where(Run.family_id == fam.id).order_by(Run.id.desc()))
        assert run is not None and run.deferred == 10 - first.checked
    assert metric("jodl_budget_exhausted_total", "check_page", "bytes_per_cycle") == exhausted + 1
    assert metric("jodl_jobs_deferred_total", "check_page", "bytes_per_cycle") == (
        deferred + 10 - first.checked
    )

    # The next cycle checks pages the first one did not, first.
    second = run_app_cycle(store, settings)
    again = {p for p in paths if site.requests(p)} - fetched
    assert 3 <= second.checked <= 5 and len(again) == second.checked
    assert all(len(site.requests(p)) == asked[p] for p in fetched), "not fetched again"
    # Without the budget every page is checked.
    assert jodl(store, "budget", "set", "check_page", "--bytes-per-cycle", "0").exit_code == 0
    assert run_app_cycle(store, settings).checked == 10
