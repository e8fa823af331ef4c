"""Draining nodes as the master sees them (see docs/architecture.md#detached-agents-and-drain).

A node drains when an operator says so (``jodl node drain``: the log's DRAINING
state) or when its agent does (SIGTERM). The master relays the first to the agent
and hears the second through the agent's ``draining`` call, asked about once a
second; a draining node is never a placement candidate, and its results are still
collected and acknowledged until its agent exits.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from functools import partial

from ..log.models import NodeState
from .slot import NodeSlot, NodeTable

log = logging.getLogger("jodl.master")


def follow(slot: NodeSlot, state: str, labels: dict[str, str]) -> None:
    """What the log says of a node now: drained by an operator, hello, new labels."""
    slot.load.labels = labels  # an agent's hello may bring new ones
    if state == NodeState.DRAINING:
        slot.draining = True
    elif state == NodeState.ACTIVE and not slot.link.connected and slot.link.failures:
        # Active again in the log while we had given up: the agent said hello
        # (or the operator added it back). Try it now rather than after the backoff.
        slot.link.next_try = 0.0


def poll(nodes: NodeTable, epoch: int, asked: Iterable[NodeSlot]) -> None:
    """Ask the agents of ``asked`` whether they drain, relaying ``jodl node drain`` to
    them; all at once, as a step's calls are (one by one, 500 agents took about half a
    second).

    A draining agent is asked too: the call that fails once it exited removes it.
    """
    asks = {
        slot.id: partial(slot.link.draining, epoch, slot.draining) for slot in asked if slot.usable
    }
    for node_id, draining in nodes.call_each(epoch, asks).items():
        slot = nodes.slots[node_id]
        if draining and not slot.draining_heard:
            slot.draining = slot.draining_heard = True
            nodes.store.update_node(slot.load.id, state=NodeState.DRAINING)
            log.warning(
                "node %s drains: nothing new goes there",
                slot.link.address,
                extra={"node": slot.link.address},
            )
