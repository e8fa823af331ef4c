"""Detached agents (real agent and master processes): an agent the master stops
polling starts nothing it has queued (the job running finishes, its result is held),
and resumes when polled again; every job runs exactly once, judged by the marks.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from agents import AgentProcess, spawn_jodl, wait_for

from jodl.log import Store, make_engine
from jodl.migrate import upgrade

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
        # Stop the master just after a job started: the agent holds one more queued
        # (the master keeps two jobs per slot in flight).
        wait_for(lambda: len(starts(path)) >= 2, 60, "the second job to start")
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
