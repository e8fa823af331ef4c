"""One-shot self-registration: ``jodl agent --register`` announces itself; then it is polled."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from jodl import Master, Settings, Store
from jodl.exceptions import AgentUnavailable
from jodl.registry import hello
from tests.agents import AgentProcess, free_port, wait_for

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
