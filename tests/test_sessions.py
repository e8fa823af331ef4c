"""Fencing on the agent: a newer epoch fences older masters while its leader talks; a
forged epoch (one init by a holder of a key, say 2**62) neither stops the real leader
nor locks it out of the agent until a restart."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import pytest
from agents import AgentProcess, wait_for

from jodl import Master, Settings, Store
from jodl.agent.replies import FENCED
from jodl.agent.sessions import Sessions
from jodl.agent.wire import connect
from jodl.exceptions import JodlError


def opens(sessions: Sessions, master: str, epoch: int) -> bool:
    try:
        sessions.open(master, epoch, {"x"})
    except JodlError as exc:
        assert FENCED in str(exc)
        return False
    return True


def test_a_fence_holds_while_its_leader_talks_and_lapses_after_its_silence() -> None:
    sessions = Sessions()
    sessions.fence_hold = 0.5
    newer = sessions.open("m2", 6, {"x"})
    for _ in range(3):  # the leader talks: the older master stays fenced
        assert not opens(sessions, "m1", 5)
        sessions.hear(6, newer.number, float("inf"))
    wait_for(lambda: opens(sessions, "m1", 5), timeout=10, what="the silent fence to lapse")
    assert sessions.epochs["x"] == 5 and sessions.top == 5
    assert opens(sessions, "m2", 6), "a newer epoch is always accepted"
    assert not opens(sessions, "m1", 5)


def test_the_fence_hold_must_outlast_a_lease_and_a_call(spawn_agent) -> None:
    agent = spawn_agent(env={"JODL_AGENT_FENCE_HOLD": "3"})
    conn = connect(agent.address, Settings(secret=agent.env["JODL_SECRET"], call_timeout=10.0))
    try:
        with pytest.raises(Exception, match="JODL_AGENT_FENCE_HOLD"):
            conn.root.init("m", 1, json.dumps({"give_up": 10.0, "lease_ttl": 5.0}))
    finally:
        conn.close()


def test_a_forged_epoch_neither_stops_the_leader_nor_locks_it_out(
    store: Store,
    settings: Settings,
    spawn_agent: Callable[..., AgentProcess],
    caplog: pytest.LogCaptureFixture,
) -> None:
    agent = spawn_agent(env={"JODL_AGENT_FENCE_HOLD": "8"})
    store.add_node(agent.address, slots=2)
    family = store.ensure_family("noop")
    store.add_jobs(family, ((f"a{i}", "{}") for i in range(20)))
    master = Master(settings.replace(lease_ttl=1.0, call_timeout=5.0), store=store)
    try:
        assert master.run_cycle("noop").done == 20
        # A holder of the secret (or of this node's key) sends one init and leaves.
        forger = connect(agent.address, settings)
        forger.root.init("forger", 2**62, json.dumps({"cluster": store.cluster_id()}))
        forger.close()
        store.add_jobs(family, ((f"b{i}", "{}") for i in range(20)))
        with caplog.at_level(logging.ERROR, logger="jodl.agent.client"):
            summary = master.run_cycle("noop")  # not Fenced: the database never issued it
        assert summary.done == summary.total > 20 and not summary.dead
    finally:
        master.close()
    assert "never issued" in caplog.text
