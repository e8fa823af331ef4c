"""One-process mode (``jodl up --standalone``): the agent runs inside this process.

Instead of agent subprocesses, :class:`web.cluster.LocalCluster` starts one
in-process agent (:mod:`jodl.agent.local`: the agent core without rpyc, so no port and
no secret) and registers it as the node ``local:1``. The master, its scheduler,
the web UI and every job of every family then run in this one process: for a
laptop or a small site. Cluster mode is unchanged.
"""

from __future__ import annotations

import os

from jodl.agent import DEFAULT_ADDRESS, InProcessAgent, is_local, start_agent
from jodl.log import Store
from jodl.settings.config import Settings


def start_in_process(
    store: Store, settings: Settings, database_url: str, env: dict[str, str]
) -> InProcessAgent:
    """Start the in-process agent and register (or bring back) its node.

    Families read their settings from the environment of the process that runs
    them (``JODL_SMTP_*``, and the database where ``notify`` claims its digests):
    here that is this process, so ``env`` goes into it.
    """
    os.environ.update(env)
    os.environ["JODL_DATABASE_URL"] = database_url
    agent = start_agent(settings, DEFAULT_ADDRESS)
    store.add_node(agent.address, slots=settings.agent_slots)
    return agent


def forget_in_process_nodes(store: Store) -> list[str]:
    """Mark removed the ``local:`` nodes a standalone run left (it was killed, say).

    For ``jodl up`` in cluster mode: no process serves them any more, and its
    master would otherwise retry them for ever. Returns their addresses.
    """
    gone = [n.address for n in store.nodes() if is_local(n.address)]
    for address in gone:
        store.remove_node(address)
    return gone


def describe(agent: InProcessAgent) -> str:
    """The line ``jodl up --standalone`` prints about what runs where."""
    core = agent.core
    return (
        f"  standalone: master, web UI and agent {agent.address} in this process "
        f"({core.slots} slots, {core.async_slots} async), no agent processes"
    )
