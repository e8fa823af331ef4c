"""``jodl up``'s local cluster (web/cluster.py) in this process: real agent processes,
a real serving master, the log on SQLite and PostgreSQL.

An agent that dies is started again on its port; one whose node an operator drained
exited on purpose and stays stopped (started again it would serve a node no master
uses) until the node is added back.
"""

from __future__ import annotations

import os
import signal

from agents import TEST_SECRET, wait_for

from jodl.log import NodeState, utcnow
from jodl.settings.config import Settings
from web.cluster import LocalCluster, restart_wanted


def node_state(cluster: LocalCluster, address: str) -> str:
    assert cluster.store is not None
    (state,) = [n.state for n in cluster.store.nodes(include_removed=True) if n.address == address]
    return state


def test_restarts_skip_drained_nodes() -> None:
    for state in (NodeState.ACTIVE, NodeState.SUSPECT, NodeState.UNREACHABLE):
        assert restart_wanted(state)
    assert not restart_wanted(NodeState.DRAINING)
    assert not restart_wanted(NodeState.REMOVED)


def test_a_drained_agent_is_not_started_again(db_url: str, settings: Settings) -> None:
    """Issue 24: a node drained under ``jodl up`` left its agent restarted, unused."""
    cluster = LocalCluster(
        db_url, agents=2, settings=settings, agent_env={"JODL_SECRET": TEST_SECRET}
    )
    try:
        cluster.prepare()
        cluster.start_agents()
        cluster.start_master()
        assert cluster.store is not None
        drained, crashed = cluster.children
        assert cluster.store.drain_node(drained.address)
        # The master relays the drain; the agent, holding nothing, exits; its node goes.
        wait_for(
            lambda: drained.retired or drained.restarts,
            timeout=60,
            what="the watcher to decide on the drained agent",
        )
        assert drained.restarts == 0 and not drained.alive()
        assert node_state(cluster, drained.address) in (NodeState.DRAINING, NodeState.REMOVED)

        # An agent that dies otherwise is still started again.
        assert crashed.proc is not None
        os.kill(crashed.proc.pid, signal.SIGKILL)
        wait_for(lambda: crashed.restarts == 1 and crashed.alive(), 60, "the crashed agent back")
        assert drained.restarts == 0 and not drained.alive()

        # The operator adds the drained node back: its agent starts and the master uses it.
        wait_for(
            lambda: node_state(cluster, drained.address) == NodeState.REMOVED,
            60,
            "the drained node removed",
        )
        back = utcnow()
        cluster.store.add_node(drained.address, slots=4)
        wait_for(lambda: drained.alive() and not drained.retired, 60, "the drained agent back")
        assert drained.restarts == 1

        def heard() -> bool:
            assert cluster.store is not None
            (node,) = [n for n in cluster.store.nodes() if n.address == drained.address]
            return node.state == NodeState.ACTIVE and (node.last_seen or back) > back

        wait_for(heard, 60, "the master to hear from the node again")
    finally:
        cluster.stop()
    assert not any(agent.alive() for agent in cluster.children)
