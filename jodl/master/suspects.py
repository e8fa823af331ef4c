"""Suspect nodes, then gone ones (see docs/architecture.md#calls-to-agents-suspect-and-gone-nodes).

A node whose call failed is suspect: no new jobs, retried with backoff. Each loop
step reviews the suspects: one silent past ``JODL_NODE_GRACE`` and past its agent's
detach time is gone (its executions lost, its jobs placed again); the others keep
their jobs, except queued ones expected to finish sooner elsewhere.
"""

from __future__ import annotations

import logging
import time

from ..placement import NodeLoad
from .records import job_info
from .rules import STEAL_WINDOW
from .slot import NodeSlot, NodeTable

log = logging.getLogger("jodl.master")


def review(nodes: NodeTable, epoch: int) -> None:
    """Give up suspect nodes past their grace; move their queued jobs if sooner elsewhere."""
    now = time.monotonic()
    for slot in nodes.slots.values():
        if slot.suspect_since is None or slot.removed:
            continue
        # The grace counts from the last call the agent may have heard: a hung
        # agent has been silent for a whole call timeout when its call fails, and
        # is gone then if that is past the grace (one timeout per frozen agent).
        silent = now - slot.silent_since
        info = slot.link.info
        detach = info.detach if info is not None and info.detach else None
        # Its agent detached (it starts nothing we sent, JODL_AGENT_DETACH): its
        # jobs may run elsewhere without running twice.
        detached = silent >= (detach if detach is not None else nodes.settings.call_timeout)
        if silent >= nodes.settings.node_grace and detached:
            log.warning(
                "node %s gone: suspect for %.1fs (%s); its jobs are placed again",
                slot.link.address,
                now - slot.suspect_since,
                slot.link.last_error,
                extra={"node": slot.link.address},
            )
            nodes.lose(slot, epoch, f"node gone: {slot.link.last_error}")
            slot.suspect_since = None
            nodes.mark_failed(slot)
        else:
            move_sooner(nodes, slot, now)


def move_sooner(nodes: NodeTable, slot: NodeSlot, now: float) -> int:
    """Jobs queued here (not sent) for a suspect node move to a node where they are
    expected to finish sooner than on it once it answers (at its next retry at best)."""
    queue = nodes.book.queues[slot.id]
    if not queue:
        return 0
    back_in = max(0.0, slot.link.next_try - now)
    targets: dict[str, list[NodeLoad]] = {}
    moves = []
    for job_id in list(queue)[:STEAL_WINDOW]:
        info = job_info(nodes.book.jobs[job_id])
        loads = targets.get(info.family)
        if loads is None:
            loads = targets[info.family] = nodes.candidates(info.family)
        here = back_in + nodes.knowledge.expected(info, slot.load)
        best, best_at, took = None, here, 0.0
        for load in loads:
            expected = nodes.knowledge.expected(info, load)
            at = load.queued_work / max(1, load.slots) + expected
            if at < best_at:
                best, best_at, took = load, at, expected
        if best is not None:
            nodes.book.move(job_id, best.id, took)  # counts it into best.queued_work
            moves.append(job_id)
    return len(moves)
