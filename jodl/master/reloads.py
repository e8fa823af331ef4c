"""Agents reloading their installed families, as the master relays and follows it.

An operator asks with ``jodl node reload [ADDRESS]`` (or the web UI's button): the
log marks the nodes (``reload_asked_at``). About once a second the master asks each
connected agent for the generation of its families, with ``now`` set for the nodes
marked: such an agent reads its entry points again first (:mod:`jodl.agent.installed`).
An agent may also reload by itself (SIGHUP). Either way, a generation other than
the one its last ``init`` reported means its families changed: the master
initialises it again (in the background, like a reconnect; what it queues, runs and
holds stays there and is collected as before), which records the new families on
the node, and the mark is cleared once that is done. What no agent served before may
be placed from then on (see :mod:`.coverage`).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable
from functools import partial

from ..agent.replies import AgentInfo
from .slot import NodeSlot, NodeTable

log = logging.getLogger("jodl.master")


class Reloads:
    """Relays asked reloads and re-initialises agents whose families changed."""

    def __init__(self, nodes: NodeTable) -> None:
        self.nodes = nodes
        #: node id -> (when its reload was asked, the agent's info from before, the
        #: generation it answered): relayed; cleared in the log once the families of
        #: that generation are known (a new init, or none was needed).
        self.relayed: dict[int, tuple[dt.datetime, AgentInfo, int]] = {}

    def poll(self, epoch: int, slots: Iterable[NodeSlot]) -> None:
        """One ``reload`` call per connected agent of ``slots``, all at once (from the
        node refresh, ~1/s)."""
        nodes = self.nodes
        for node_id in [n for n in self.relayed if (s := nodes.slots.get(n)) is None or s.removed]:
            del self.relayed[node_id]
        asked = nodes.store.reloads_asked()
        asks: dict[int, Callable[[], int]] = {}
        nows: dict[int, bool] = {}
        for slot in slots:
            if slot.removed or not slot.usable:
                continue
            if self._cleared(slot):
                continue
            nows[slot.id] = now = slot.id in asked and slot.id not in self.relayed
            asks[slot.id] = partial(slot.link.reload, epoch, now)
        for node_id, generation in nodes.call_each(epoch, asks).items():
            slot = nodes.slots[node_id]
            if generation is None or slot.link.info is None:
                continue  # down: asked again once it answers
            now = nows[node_id]
            if now:
                self.relayed[slot.id] = (asked[slot.id], slot.link.info, generation)
            if generation != slot.link.info.generation:
                log.warning(
                    "node %s reloaded its families: initialising it again",
                    slot.link.address,
                    extra={"node": slot.link.address},
                )
                nodes.reinit(slot, epoch)
            elif now:
                self._cleared(slot)

    def _cleared(self, slot: NodeSlot) -> bool:
        """A relayed reload whose new families are known (the agent's init reported its
        generation): cleared in the log. True while one is relayed (nothing to ask)."""
        relayed = self.relayed.get(slot.id)
        if relayed is None:
            return False
        when, before, generation = relayed
        info = slot.link.info
        if slot.opening is not None or (info is before and info.generation != generation):
            return True  # its new families are not known yet
        del self.relayed[slot.id]
        self.nodes.store.reload_relayed(slot.id, when)
        log.info("node %s: families reloaded as asked", slot.link.address)
        return True


__all__ = ["Reloads"]
