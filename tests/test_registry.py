"""Self-registration: ``jodl agent --register`` says hello at start and whenever detached."""

from __future__ import annotations

import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from agents import (
    AgentProcess,
    free_port,
    port_answers,
    run_jodl,
    spawn_jodl,
    wait_for,
)

from jodl import Master, Settings, Store
from jodl.agent.registry import HELLO_BACKOFF_START, hello, hello_pauses, master_addresses
from jodl.exceptions import AgentUnavailable
from jodl.log import make_engine
from jodl.log.migrate import upgrade

SECRET = "registry-test-secret-of-enough-length"


def test_agent_registers_once_and_runs_jobs(
    store: Store, settings: Settings, spawn_agent: Callable[..., AgentProcess]
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    master = Master(settings.replace(register_listen=listen, secret=SECRET), store=store)
    master.start()
    try:
        agent = spawn_agent(env={"JODL_SECRET": SECRET}, args=("--register", listen))
        wait_for(
            lambda: [n for n in store.nodes() if n.address == agent.address],
            what="the agent's hello to be recorded",
        )
        store.add_jobs(store.ensure_family("noop"), ((f"k{i}", "{}") for i in range(50)))
        summary = master.run_cycle("noop")
    finally:
        master.close()
    assert summary.done == 50
    [node] = store.nodes()
    assert node.address == agent.address and node.state == "active"


def test_hello_without_the_secret_is_refused(store: Store, settings: Settings) -> None:
    listen = f"127.0.0.1:{free_port()}"
    master = Master(settings.replace(register_listen=listen, secret=SECRET), store=store)
    master.start()
    try:
        with pytest.raises(AgentUnavailable, match="hello"):
            hello(listen, "127.0.0.1:1", 1, settings.replace(secret="wrong"))
        hello(listen, "127.0.0.1:2", 3, settings.replace(secret=SECRET))
    finally:
        master.close()
    assert [(n.address, n.slots) for n in store.nodes()] == [("127.0.0.1:2", 3)]


# -- detached agents say hello again -------------------------------------------------------


def test_hello_pauses_double_up_to_the_cap_with_jitter() -> None:
    pauses = hello_pauses(4.0, random.Random(7))
    seen = [next(pauses) for _ in range(12)]
    for i, pause in enumerate(seen):
        ceiling = min(4.0, HELLO_BACKOFF_START * 2**i)
        assert ceiling / 2 <= pause <= ceiling
    assert len(set(seen)) == len(seen)  # jittered: no two agents keep in step


def test_register_takes_a_comma_list_and_repeats() -> None:
    assert master_addresses(("a:1,b:2", " b:2 ", "c:3")) == ["a:1", "b:2", "c:3"]
    with pytest.raises(ValueError):
        master_addresses(("nohost",))


def test_a_detached_agent_says_hello_again_and_resumes(
    pg_database: str, spawn_agent: Callable[..., AgentProcess], tmp_path: Path
) -> None:
    engine = make_engine(pg_database)
    upgrade(engine)
    store = Store(engine)
    listen = f"127.0.0.1:{free_port()}"
    dead = f"127.0.0.1:{free_port()}"  # a master address nobody serves
    env = {
        "JODL_DATABASE_URL": pg_database,
        "JODL_METRICS_LISTEN": "",
        "JODL_REGISTER_LISTEN": listen,
        "JODL_CALL_TIMEOUT": "3",
    }
    masters = []
    # A family for the masters to lead (a master leading nothing polls no agent).
    family = store.ensure_family("noop")
    try:
        masters.append(spawn_jodl("master", log_path=tmp_path / "m1.log", env=env))
        wait_for(lambda: port_answers(int(listen.rpartition(":")[2])), 30, "the first master")
        started = time.monotonic()
        agent = spawn_agent(
            env={"JODL_AGENT_DETACH": "1.5", "JODL_AGENT_HELLO_BACKOFF_MAX": "1"},
            args=("--register", f"{dead},{listen}", "--slots", "3", "--label", "zone=a"),
        )
        # The hello brings the agent's slots and labels.
        wait_for(
            lambda: [n for n in store.nodes() if n.address == agent.address],
            30,
            "the agent's hello to be recorded",
        )
        [node] = store.nodes()
        assert (node.slots, node.labels) == (3, {"zone": "a"})
        wait_for(lambda: store.nodes()[0].last_seen is not None, 30, "the master to poll it")
        # The master dies; the operator forgets the node meanwhile. Only the detached
        # agent's new hellos can bring it back to the next master.
        masters[0].send_signal(signal.SIGKILL)
        masters[0].wait(timeout=10)
        assert store.remove_node(agent.address)
        masters.append(spawn_jodl("master", log_path=tmp_path / "m2.log", env=env))
        wait_for(
            lambda: [n for n in store.nodes() if n.state == "active"],
            60,
            "the agent to say hello to the new master",
        )
        store.add_jobs(family, ((f"k{i}", "{}") for i in range(20)))
        out = run_jodl("run", "noop", env=env)
        assert out.returncode == 0 and "20/20 done" in out.stdout, out.stdout + out.stderr
    finally:
        for master in masters:
            master.kill()
            master.wait(timeout=10)
        engine.dispose()
    # Said hello again (to the dead address too), without flooding: each pause is at
    # least a quarter second (half the first backoff), whatever the machine's load.
    elapsed = time.monotonic() - started
    tries = agent.log().count(f"cannot say hello to the master at {dead}")
    assert 2 <= tries <= elapsed / (HELLO_BACKOFF_START / 2) + 2, agent.log()
