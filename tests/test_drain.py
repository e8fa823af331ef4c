"""Drain (``jodl node drain`` and SIGTERM on an agent), with real processes.

Judged by the marks the ``mark`` family leaves (one line per real run) as well as by
the log: every job runs exactly once, the draining agent exits 0 once its results
are acknowledged, the cycle completes on the other agent, and the node shows as
``draining`` then is removed.
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agents import TEST_SECRET, AgentProcess, spawn_jodl, wait_for

from jodl import Master, Settings
from jodl.agent.core import AgentCore
from jodl.agent.drain import Drain
from jodl.log import Store, make_engine
from jodl.log.migrate import upgrade
from jodl.log.models import NodeState

JOBS = 30
#: Each job's sleep (seconds): long enough that the drained agent has jobs in flight
#: when it hears of the drain, short enough for a quick test.
SECONDS = 0.4
SLOTS = 2


@pytest.fixture
def pg_store(pg_database: str) -> Any:
    engine = make_engine(pg_database)
    upgrade(engine)
    yield pg_database, Store(engine)
    engine.dispose()


def marks(path: Path) -> list[tuple[str, str]]:
    """(agent port, job key) of every line the ``mark`` family wrote."""
    if not path.exists():
        return []
    lines = (line.split(" ") for line in path.read_text().splitlines())
    return [(node.rpartition(":")[2], key) for node, key in lines]


def node_state(store: Store, address: str) -> str:
    [node] = [n for n in store.nodes(include_removed=True) if n.address == address]
    return node.state


def drain_mid_cycle(
    pg_store: Any,
    spawn_agent: Callable[..., Any],
    tmp_path: Path,
    drain: Callable[[AgentProcess, dict[str, str]], None],
) -> None:
    url, store = pg_store
    path = tmp_path / "marks.txt"
    env = {"JODL_AGENT_SLOTS": str(SLOTS)}
    drained, other = spawn_agent(count=2, env=env)
    for agent in (drained, other):
        store.add_node(agent.address, slots=SLOTS)
    store.add_jobs(
        store.ensure_family("mark"),
        (
            (f"m{i}", json.dumps({"key": f"m{i}", "path": str(path), "seconds": SECONDS}))
            for i in range(JOBS)
        ),
    )
    master_env = {"JODL_DATABASE_URL": url, "JODL_METRICS_LISTEN": "", "JODL_CALL_TIMEOUT": "10"}
    master = spawn_jodl("run", "mark", log_path=tmp_path / "master.log", env=master_env)
    try:
        port = str(drained.port)
        wait_for(
            lambda: sum(1 for p, _ in marks(path) if p == port) >= SLOTS,
            60,
            "the first agent to start jobs",
        )
        drain(drained, master_env)
        # Shown as draining while its jobs in flight finish (each runs SECONDS).
        wait_for(
            lambda: node_state(store, drained.address) == NodeState.DRAINING,
            30,
            "the node to show as draining",
        )
        try:
            code = drained.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            master_log = (tmp_path / "master.log").read_text()
            raise AssertionError(
                f"the drained agent did not exit\n{drained.log()}\n--- master\n{master_log}"
            ) from None
        assert code == 0, drained.log()
        assert master.wait(timeout=120) == 0, (tmp_path / "master.log").read_text()
    finally:
        if master.poll() is None:
            master.kill()
    ran = marks(path)
    # Every job ran exactly once (the file, not the log, says so) ...
    assert Counter(key for _, key in ran) == Counter(f"m{i}" for i in range(JOBS))
    # ... the drained agent ran some, the rest ran on the other agent after the drain.
    ports = Counter(p for p, _ in ran)
    assert ports[str(drained.port)] >= SLOTS and ports[str(other.port)] > 0
    # Removed once a master finds it gone: the one of the cycle if it polled it after
    # the exit, else the next one to start.
    if node_state(store, drained.address) != NodeState.REMOVED:
        settings = Settings.from_env(env={}, database_url=url, secret=TEST_SECRET)
        master_again = Master(settings, store=store)
        try:
            master_again.start()
        finally:
            master_again.close()
    assert node_state(store, drained.address) == NodeState.REMOVED
    assert node_state(store, other.address) == NodeState.ACTIVE
    # The master agrees: every job has its result, none dead.
    assert f"{JOBS}/{JOBS} done" in (tmp_path / "master.log").read_text()
    assert ", 0 dead" in (tmp_path / "master.log").read_text()


def test_sigterm_drains_an_agent_mid_cycle(
    pg_store: Any, spawn_agent: Callable[..., Any], tmp_path: Path
) -> None:
    drain_mid_cycle(
        pg_store, spawn_agent, tmp_path, lambda a, _: a.proc.send_signal(signal.SIGTERM)
    )


def test_node_drain_command_drains_an_agent_mid_cycle(
    pg_store: Any, spawn_agent: Callable[..., Any], tmp_path: Path
) -> None:
    def command(agent: AgentProcess, env: dict[str, str]) -> None:
        from agents import run_jodl

        done = run_jodl("node", "drain", agent.address, env=env)
        assert done.returncode == 0 and "draining" in done.stdout, done.stderr

    drain_mid_cycle(pg_store, spawn_agent, tmp_path, command)


def test_drain_of_an_unknown_node_is_one_clear_line(pg_store: Any) -> None:
    from agents import run_jodl

    url, _ = pg_store
    out = run_jodl("node", "drain", "127.0.0.1:1", env={"JODL_DATABASE_URL": url})
    assert (
        out.returncode == 1
        and out.stderr.strip() == "error: no node '127.0.0.1:1' (or it is removed)"
    )


def test_an_agent_drains_only_after_its_results_are_acknowledged() -> None:
    core = AgentCore("a", slots=1, families=None)
    drain = Drain(core)
    try:
        core.init("m", 1, json.dumps({"give_up": 30.0}))
        core.resume()
        core.send([(1, "noop", "{}")])
        assert not drain.answer(False)  # not asked yet
        drain.start("test")
        wait_for(lambda: core.remaining()[3] + core.remaining()[2] == 1, 20, "the result")
        assert not drain.drained()  # the master has not heard, nor collected
        assert drain.answer(False)
        assert not drain.drained()  # the result is still held
        core.ack([1])
        assert drain.drained()
    finally:
        core.close()


def test_an_agent_no_master_served_exits_at_once_on_sigterm(
    spawn_agent: Callable[..., AgentProcess],
) -> None:
    agent = spawn_agent()
    agent.proc.send_signal(signal.SIGTERM)
    try:
        assert agent.proc.wait(timeout=30) == 0
    except subprocess.TimeoutExpired:
        pytest.fail(f"the agent did not exit:\n{agent.log()}")
