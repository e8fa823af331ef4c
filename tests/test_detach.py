"""Detached agents (real agent and master processes): an agent the master stops
polling starts nothing it has queued (the job running finishes, its result is held),
and resumes when polled again, by the same master or by a standby that took over;
every job runs exactly once, judged by the marks.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents import AgentProcess, spawn_jodl, wait_for
from sqlalchemy import select
from test_crash import add_mark_jobs, check_complete, check_marks, executions, runs_by_key
from test_standby import (
    by_pid,
    committed_keys,
    lease,
    logs,
    postgres,
    run_finished,
    settled,
    start_masters,
    stop_all,
    wait_logged,
)

from jodl.log import Dispatch, Store, make_engine
from jodl.log.migrate import upgrade

#: The agent's detach time (seconds).
DETACH = 1.0
#: Each job's sleep (seconds): much longer than DETACH, so the job running when the
#: master stops ends well after the agent detached.
SECONDS = 2.5
#: After the stop, the running job ends within SECONDS; what was queued would start
#: then. Looked at this much later (generous for a loaded machine: scheduling delays
#: only make a wrongly started job show up later, never earlier than SECONDS).
LOOK = SECONDS + 1.5
JOBS = 5


def starts(path: Path) -> list[str]:
    """The keys of the ``mark`` jobs that started, in order (``end`` lines left out)."""
    if not path.exists():
        return []
    return [line.split(" ")[1] for line in path.read_text().splitlines() if " end" not in line]


def dispatched(store: Store, epoch: int | None = None) -> int:
    """Executions logged as sent (by the master of ``epoch``, if given)."""
    query = select(Dispatch.items)
    if epoch is not None:
        query = query.where(Dispatch.epoch == epoch)
    with store.engine.connect() as conn:
        return sum(len(json.loads(items)) for items in conn.scalars(query))


def test_an_agent_not_polled_starts_nothing_queued_and_resumes_when_polled(
    pg_database: str, spawn_agent: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    engine = make_engine(pg_database)
    upgrade(engine)
    store = Store(engine)
    path = tmp_path / "marks.txt"
    agent = spawn_agent(
        env={"JODL_AGENT_SLOTS": "1", "JODL_AGENT_DETACH": str(DETACH), "JODL_CALL_TIMEOUT": "10"}
    )
    store.add_node(agent.address, slots=1)
    payload = {"path": str(path), "seconds": SECONDS, "end": True}
    store.add_jobs(
        store.ensure_family("mark"),
        ((f"m{i}", json.dumps({**payload, "key": f"m{i}"})) for i in range(JOBS)),
    )
    # The master gives up after 10 s: longer than the stop below, so it carries on after.
    env = {
        "JODL_DATABASE_URL": pg_database,
        "JODL_METRICS_LISTEN": "",
        "JODL_CALL_TIMEOUT": "10",
    }
    master = spawn_jodl("run", "mark", log_path=tmp_path / "master.log", env=env)
    stopped = False
    try:
        # Stop the master while the second job runs and the third waits queued on the
        # agent (the master keeps two jobs per slot in flight): the third is logged as
        # sent (write-ahead), and the send call follows within moments.
        wait_for(lambda: len(starts(path)) >= 2, 60, "the second job to start")
        wait_for(lambda: dispatched(store) >= 3, 60, "the third job to be sent")
        time.sleep(0.3)
        assert len(starts(path)) == 2, "the second job runs for seconds"
        os.kill(master.pid, signal.SIGSTOP)
        stopped = True
        at_stop = starts(path)
        time.sleep(LOOK)  # the duration under test, not a synchronisation
        during = starts(path)
        ended = [line for line in path.read_text().splitlines() if line.endswith(" end")]
        os.kill(master.pid, signal.SIGCONT)
        stopped = False
        assert master.wait(timeout=120) == 0, (tmp_path / "master.log").read_text()
    finally:
        if stopped:
            os.kill(master.pid, signal.SIGCONT)
        if master.poll() is None:
            master.kill()
        engine.dispose()
    # The job running at the stop finished; the queued one did not start while detached.
    assert len(ended) >= len(at_stop) - 0 and f"{at_stop[-1]} end" in " ".join(ended)
    assert during == at_stop, "a detached agent started a queued job"
    # Polled again, it resumed: the cycle completed, every job ran exactly once.
    log = (tmp_path / "master.log").read_text()
    assert f"{JOBS}/{JOBS} done" in log, log
    assert Counter(starts(path)) == Counter(f"m{i}" for i in range(JOBS))


#: A lease TTL long against the agents' detach time: between the detach and the
#: takeover (at least 2/3 of it after the freeze) there are seconds in which no job
#: may start.
FROZEN_TTL = 6.0
#: The agents' detach time, and each job's sleep: longer, so most jobs queued at the
#: freeze are still queued when the agents detach.
FROZEN_DETACH = 0.5
FROZEN_SECONDS = 2.0
#: After the freeze: the detach time and room for a loaded machine. From then until
#: the standby leads, no job may start.
QUIET_AFTER = 1.5


@postgres
def test_a_frozen_leaders_agents_start_nothing_until_a_standby_leads(
    store: Store, agents: Any, db_url: str, tmp_path: Path
) -> None:
    """Two masters, the leader frozen (SIGSTOP) mid-cycle: its agents detach and start
    nothing more of what it queued until the standby took the lease, then the standby
    finishes the run; a job whose result was committed never runs again, no job is
    lost (the marks)."""
    marks = tmp_path / "marks.txt"
    add_mark_jobs(store, marks, count=40, seconds=FROZEN_SECONDS)
    agents(2, slots=2, env={"JODL_AGENT_DETACH": str(FROZEN_DETACH)})
    masters = start_masters(2, db_url, tmp_path, ttl=FROZEN_TTL)
    samples: list[tuple[float, int, str]] = []
    try:
        holder, epoch = settled(store, 2)
        leader = by_pid(masters, holder)
        request = store.request_run("mark")
        wait_logged(lambda: len(committed_keys(store)) >= 4, tmp_path, 60, "a cycle under way")
        leader.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        done_at_freeze = committed_keys(store)
        while True:
            # The marks first, then the lease: a count read while the old leader still
            # held the lease has no start the new leader caused.
            started = sum(runs_by_key(marks).values())
            now = lease(store)
            samples.append((time.monotonic() - frozen, started, now[0] if now else ""))
            if now is not None and now[0] != holder:
                break
            assert time.monotonic() - frozen < 10 * FROZEN_TTL, logs(tmp_path)
            time.sleep(0.05)
        sent = dispatched(store, epoch)
        leader.send_signal(signal.SIGCONT)
        # Woken after the takeover, it finds itself fenced and stands by.
        wait_logged(lambda: "stops, standing by" in logs(tmp_path), tmp_path, 30, "it to stand by")
        assert leader.poll() is None, logs(tmp_path)
        run_finished(store, request, tmp_path, "the standby to finish the run")
    finally:
        stop_all(masters)
    quiet = [(t, n) for t, n, who in samples if t >= QUIET_AFTER and who == holder]
    assert quiet and quiet[-1][0] - quiet[0][0] >= 1.0, f"no quiet window to judge: {samples}"
    assert sent > quiet[0][1], f"nothing was queued on the agents to judge by: {sent} sent"
    assert quiet[-1][1] == quiet[0][1], f"a detached agent started queued jobs: {quiet}"
    ran = runs_by_key(marks)
    assert len(ran) == 40, "no job lost"
    again = {key for key, n in ran.items() if n > 1 and key in done_at_freeze}
    assert not again, f"jobs with a committed result ran again: {sorted(again)}"
    after = executions(store)
    check_complete(store, after)
    check_marks(store, marks, after)
