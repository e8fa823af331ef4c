"""Effects judged by the marks jobs leave, not by the log alone.

The ``mark`` family appends one line per real run to a file (O_APPEND), naming
the agent and the job: the ground truth of what ran where. A frozen agent
(SIGSTOP past the master's give-up time) must not run, once thawed, a job whose
result was committed elsewhere; agents reused with a fresh database must run its
jobs although its execution ids start from 1 again.
"""

from __future__ import annotations

import json
import os
import signal
import threading
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from agents import TEST_SECRET, AgentProcess, wait_for
from sqlalchemy import select

from jodl.agent.replies import KNOWN_ID
from jodl.agent.wire import connect
from jodl.exceptions import ConfigError
from jodl.log import Store, make_engine
from jodl.log.migrate import upgrade
from jodl.log.models import ExecState, Execution, Job, Node
from jodl.master import Master, RunSummary
from jodl.settings.config import Settings

#: The master's give-up time in these tests (seconds); agents detach after half of it.
GIVE_UP = 2.0
#: Agents' job slots.
SLOTS = 4


def marks(path: Path) -> list[tuple[str, str]]:
    """(agent port, job key) of every line the ``mark`` family wrote, in order."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        node, key = line.split(" ")
        out.append((node.rpartition(":")[2], key))
    return out


def add_mark_jobs(store: Store, path: Path, count: int, seconds: float) -> None:
    fam = store.ensure_family("mark")
    store.add_jobs(
        fam,
        (
            (f"m{i}", json.dumps({"key": f"m{i}", "path": str(path), "seconds": seconds}))
            for i in range(count)
        ),
    )


def logged(store: Store) -> list[tuple[str, str, str]]:
    """(agent port, job key, state) of every execution outcome in the log."""
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(Node.address, Job.key, Execution.state)
            .join(Job, Job.id == Execution.job_id)
            .join(Node, Node.id == Execution.node_id)
        )
        return [(address.rpartition(":")[2], key, state) for address, key, state in rows]


def in_thread(master: Master, family: str) -> Future[RunSummary]:
    future: Future[RunSummary] = Future()

    def run() -> None:
        try:
            future.set_result(master.run_cycle(family))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            future.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return future


def settings(url: str) -> Settings:
    return Settings.from_env(env={}, database_url=url, call_timeout=GIVE_UP, secret=TEST_SECRET)


def test_detach_must_be_shorter_than_the_give_up_time() -> None:
    with pytest.raises(ConfigError, match="JODL_AGENT_DETACH .* shorter than JODL_CALL_TIMEOUT"):
        Settings.from_env(env={"JODL_AGENT_DETACH": "3", "JODL_CALL_TIMEOUT": "2"})


def test_a_frozen_agent_runs_nothing_committed_elsewhere(
    store: Store, db_url: str, spawn_agent: Any, tmp_path: Path
) -> None:
    path = tmp_path / "marks.txt"
    frozen, other = spawn_agent(count=2, env={"JODL_AGENT_SLOTS": str(SLOTS)})
    for agent in (frozen, other):
        store.add_node(agent.address, slots=SLOTS)
    add_mark_jobs(store, path, 400, 0.02)
    master = Master(settings(db_url), store=store)
    stopped = False
    try:
        future = in_thread(master, "mark")
        # Freeze it while it holds a queue of jobs the master sent.
        wait_for(
            lambda: sum(1 for port, _ in marks(path) if port == str(frozen.port)) >= 20,
            60,
            "the first agent to run some jobs",
        )
        os.kill(frozen.pid, signal.SIGSTOP)
        stopped = True
        summary = future.result(timeout=120)
        assert summary.done == 400 and summary.dead == 0
        before = len(marks(path))
        lost = [x for x in logged(store) if x[0] == str(frozen.port) and x[2] == ExecState.LOST]
        assert lost, "the master gave up on the frozen agent's executions"
    finally:
        master.close()
        if stopped:
            os.kill(frozen.pid, signal.SIGCONT)
    # Thawed: a master speaks to it again and cancels what it gave up on; the agent
    # then has nothing left to start.
    again = Master(settings(db_url), store=store)
    try:
        again.start()
        slot = next(s for s in again.nodes.values() if s.link.address == frozen.address)
        wait_for(lambda: slot.usable or again.refresh_nodes(), 30, "the thawed agent to connect")
        wait_for(
            lambda: slot.link.remaining(again.epoch)[:2] == (0, 0),
            30,
            "the thawed agent to have nothing queued or running",
        )
    finally:
        again.close()
    after = marks(path)
    # A worker frozen between taking a job from the queue and the job's first line
    # writes that line once thawed: at most one per slot, each of a job it had started.
    # Anything started from the queue after SIGCONT would be many more.
    late = after[before:]
    assert len(late) <= SLOTS, f"jobs given up on started after SIGCONT: {late}"
    assert {port for port, _ in late} <= {str(frozen.port)}
    # The log agrees with the file: every result has its mark on its node, and no job
    # left more marks on a node than the log has executions of it there.
    runs = Counter(after)
    attempts = Counter((port, key) for port, key, _ in logged(store))
    done = {(port, key) for port, key, state in logged(store) if state == ExecState.DONE}
    assert all(runs[pair] >= 1 for pair in done)
    assert all(count <= attempts[pair] for pair, count in runs.items())
    assert len({key for _, key in after}) == 400


def test_agents_reused_with_a_fresh_database_run_its_jobs(
    store: Store, db_url: str, spawn_agent: Any, tmp_path: Path
) -> None:
    agents: list[AgentProcess] = spawn_agent(count=2, env={"JODL_AGENT_SLOTS": str(SLOTS)})
    second_url = f"sqlite:///{tmp_path / 'second.db'}"
    engine = make_engine(second_url)
    upgrade(engine)
    second = Store(engine)
    try:
        for log_store, url, count in ((store, db_url, 60), (second, second_url, 30)):
            for agent in agents:
                log_store.add_node(agent.address, slots=SLOTS)
            fam = log_store.ensure_family("noop")
            log_store.add_jobs(fam, ((f"n{i}", "{}") for i in range(count)))
            master = Master(settings(url), store=log_store)
            try:
                # Both databases number executions from 1: the agents must not take
                # the second one's ids for the first one's (they did, and it hung).
                summary = in_thread(master, "noop").result(timeout=60)
            finally:
                master.close()
            assert summary.done == count
    finally:
        engine.dispose()


def test_an_agent_binds_ids_to_its_cluster_and_session(spawn_agent: Any) -> None:
    agent = spawn_agent()
    own = Settings(call_timeout=10.0, secret=TEST_SECRET)
    first, second = (connect(agent.address, own) for _ in range(2))
    try:
        root = first.root
        hello = json.dumps({"cluster": "one", "give_up": 10.0})
        stamp = (1, json.loads(root.init("m", 1, hello))["session"], 0.0)
        assert root.send(stamp, ((1, "noop", "{}"),)) == ()
        wait_for(lambda: root.done(stamp, (), 10), 20, "the result of execution 1")
        root.ack(stamp, (1,))
        # Finished here: sent again, it is refused and said, not dropped in silence.
        ((refused_id, error),) = root.send(stamp, ((1, "noop", "{}"),))
        assert refused_id == 1 and error.startswith(KNOWN_ID)
        # A master of another database: the agent forgets the old ids; 1 runs again.
        other = second.root
        hello = json.dumps({"cluster": "two", "give_up": 10.0})
        fresh = (1, json.loads(other.init("m2", 1, hello))["session"], 0.0)
        with pytest.raises(Exception, match="stale connection"):
            root.remaining(stamp)  # the first connection's session was replaced
        assert other.send(fresh, ((1, "noop", "{}"),)) == ()
        wait_for(lambda: other.done(fresh, (), 10), 20, "execution 1 of the new database")
    finally:
        first.close()
        second.close()
