"""The master's nodes: one :class:`NodeSlot` per agent, connected, refreshed and lost here.

:class:`Nodes` follows the node table of the log (nodes added or removed while the
master runs), connects to agents with backoff (in the background: a frozen agent
holds up no step, see :mod:`jodl.master.calls`), reconciles what a reconnected agent
still queues, and when a node is removed gives its jobs back through the job book
(their executions closed as lost in the log).

Suspect before gone (docs/architecture.md): a node whose call fails is *suspect*:
it gets no new jobs, the jobs queued for it here move only where they would finish
sooner, and it is retried with backoff and jitter. Answering again, it keeps what
it learned and what its agent still holds. After ``JODL_NODE_GRACE`` seconds
suspect (and never before ``JODL_CALL_TIMEOUT`` of silence, so its agent has
detached) it is *gone*: its executions are lost and its jobs placed again.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Concatenate, ParamSpec, TypeVar

from .. import failpoint
from ..agent.client import AgentLink
from ..agent.local import make_link
from ..agent.replies import AgentInfo
from ..exceptions import AgentUnavailable, Fenced
from ..log.models import ExecState, NodeState, utcnow
from ..placement import NodeLoad
from . import drain, suspects
from .calls import Calls
from .parts import PartOf, Parts
from .progress import ProgressRelay
from .records import execution_row
from .reloads import Reloads
from .rules import REMOVED, UNREACHABLE, USABLE, allows
from .slot import NodeSlot

_R = TypeVar("_R")
_P = ParamSpec("_P")
log = logging.getLogger("jodl.master")

#: Seconds between two reloads of the node table (nodes added or removed meanwhile).
NODE_REFRESH = 1.0
#: Agents with jobs in flight asked at each node refresh whether they drain, reloaded
#: their families or have progress to report: all of them up to this many, else this
#: many in turn (idle agents are all asked: the question keeps them attached, and no
#: other call reaches them). Each question is a call; asked of 500 busy agents every
#: second, they were as many calls as collecting and sending made, and slowed the
#: loop that polls every agent (bench/farm.py).
ASK_IN_TURN = 100


class Nodes(PartOf):
    """The nodes of the cluster as the loop uses them, by node id."""

    def __init__(self, parts: Parts) -> None:
        super().__init__(parts)
        self.settings = parts.settings
        self.knowledge = parts.knowledge
        #: Calls to several agents at once, and reconnects in the background.
        self.calls = Calls()
        self.store = parts.store
        self.book = parts.book
        self.ledger = parts.ledger
        self.families = parts.families
        #: family -> the version this master knows (of the class installed with it).
        self.versions = parts.versions
        self.slots: dict[int, NodeSlot] = {}
        self.master_id = ""
        self.cluster = ""
        #: The families this master leads, told to agents at init (None: every one).
        self.led: list[str] | None = None
        self._last_refresh = 0.0
        #: Where the next refresh's questions start among the nodes (:meth:`_in_turn`).
        self._turn = 0
        #: Agents' families reloaded (``jodl node reload``, SIGHUP): see :mod:`.reloads`.
        self.reloads = Reloads(self)
        self.progress = ProgressRelay()  # long jobs' reports: see :mod:`.progress`

    def __iter__(self) -> Iterator[NodeSlot]:
        return iter(self.slots.values())

    def get(self, node_id: int | None) -> NodeSlot | None:
        return self.slots.get(node_id) if node_id is not None else None

    def __getitem__(self, node_id: int) -> NodeSlot:
        return self.slots[node_id]

    def usable(self) -> list[NodeSlot]:
        return [s for s in self.slots.values() if s.usable]

    # -- which node may run what ---------------------------------------------------------

    def allowed(self, family: str, slot: NodeSlot) -> bool:
        """May ``slot`` run ``family`` now: the agent has it (at the known version),
        FamilyOnNode allows, not late."""
        if not slot.usable or family not in slot.families or slot.late or slot.draining:
            return False
        if family in slot.unchecked and not self._same_version(slot, family):
            return False
        rule = self.families.rule(family, slot.load.id)
        if rule is None:
            return True
        return allows(rule.allowed, rule.conditions, slot.load.labels)

    def candidates(self, family: str) -> list[NodeLoad]:
        """The nodes placement may choose from for ``family``."""
        return [s.load for s in self.slots.values() if self.allowed(family, s)]

    def state(self, node_id: int) -> str:
        slot = self.slots.get(node_id)
        if slot is None or slot.removed:
            return REMOVED
        return USABLE if slot.usable else UNREACHABLE

    # -- connecting ------------------------------------------------------------------------

    def _in_turn(self) -> list[NodeSlot]:
        """The nodes asked at this refresh: the idle ones, and those with jobs in flight
        (polled every step anyway) all or the next :data:`ASK_IN_TURN` in turn."""
        flights = self.book.flights
        busy = [s for s in self.slots.values() if not s.removed and flights.get(s.id)]
        idle = [s for s in self.slots.values() if not s.removed and not flights.get(s.id)]
        if len(busy) <= ASK_IN_TURN:
            return idle + busy
        start = self._turn % len(busy)
        self._turn = start + ASK_IN_TURN
        return idle + (busy + busy)[start : start + ASK_IN_TURN]

    def refresh(self, epoch: int, force: bool = False) -> None:
        """Pick up nodes added or removed in the log; reconnect unreachable ones when due
        (in the background; with ``force``, waiting for them); give up suspect ones."""
        now = time.monotonic()
        if force or now - self._last_refresh >= NODE_REFRESH:
            self._last_refresh = now
            for node in self.store.nodes(include_removed=True):
                slot = self.slots.get(node.id)
                if node.state == NodeState.REMOVED:
                    if slot is not None and not slot.removed:
                        slot.removed = True
                        self.down(slot, epoch, gone=True)
                        self.parts.node_gone(node.id)  # its homes are freed
                    continue
                if slot is None or slot.removed:
                    link = make_link(node.id, node.address, self.settings, self.store.newest_epoch)
                    labels = dict(node.labels or {})
                    load = NodeLoad(node.id, node.address, node.slots, node.speed or 1.0, labels)
                    self.slots[node.id] = slot = NodeSlot(link, load)
                    self.book.add_node(load)
                self._rekeyed(slot, (node.key_oldest, node.key_generation), epoch)
                drain.follow(slot, node.state, dict(node.labels or {}))
            asked = self._in_turn()
            drain.poll(self, epoch, asked)
            self.reloads.poll(epoch, asked)
            ask = lambda slot: self.call(slot, epoch, AgentLink.progress, epoch)  # noqa: E731
            self.progress.poll(asked, self.book.flights, ask, self.store)
        self._take_opened(epoch)
        for slot in self.slots.values():
            if not slot.removed and slot.opening is None and slot.link.retry_due():
                opening = partial(slot.link.open, self.master_id, epoch, self._init_settings())
                slot.opening = self.calls.start(opening)
        if force:
            self._await_opened()
        self._take_opened(epoch)
        suspects.review(self, epoch)

    def _rekeyed(self, slot: NodeSlot, key_range: tuple[int, int], epoch: int) -> None:
        """Follow ``jodl node rekey``: a connection made when a key now refused was still
        accepted is closed and opened again at once (in the background; the node gets
        nothing meanwhile), so an agent still on that key is refused from now on."""
        if slot.opening is not None or not slot.link.rekeyed(key_range):
            return
        log.warning(
            "node %s was rekeyed: reconnecting, under its key of generation %d",
            slot.link.address,
            key_range[1],
            extra={"node": slot.link.address},
        )
        slot.link.close()
        opening = partial(slot.link.open, self.master_id, epoch, self._init_settings())
        slot.opening = self.calls.start(opening)

    def reopen(self, epoch: int, wait: bool = False) -> None:
        """This master's epoch or families changed: every connected agent opens a new
        session (in the background; the node gets nothing meanwhile), so it takes the
        newly led families' executions and fences their old leader. ``wait``: until
        every agent answered (at most a call timeout), before a run is resumed and
        asks them what they hold."""
        for slot in self.slots.values():
            if not slot.removed and slot.opening is None and slot.link.connected:
                self.reinit(slot, epoch)
        if wait:
            self._await_opened()
            self._take_opened(epoch)

    def reinit(self, slot: NodeSlot, epoch: int) -> None:
        """Initialise ``slot``'s agent again in the background (a new session; the node
        gets nothing meanwhile): what it says is applied as on a reconnect."""
        init = partial(slot.link.init, self.master_id, epoch, self._init_settings())
        slot.opening = self.calls.start(init)

    def _await_opened(self) -> None:
        """Wait for every connection or new session under way (each within a call timeout)."""
        for slot in self.slots.values():
            if slot.opening is not None:
                slot.opening.result()

    def _take_opened(self, epoch: int) -> None:
        """Apply the reconnects that ended (in the loop thread: they change the book)."""
        for slot in self.slots.values():
            if slot.opening is None or not slot.opening.done():
                continue
            outcome, slot.opening = slot.opening.result(), None
            if slot.removed:
                slot.link.close()
                continue
            try:
                self.connected(slot, epoch, outcome.get())
            except Fenced:
                raise  # refused for our old epoch: stop, the node is fine
            except AgentUnavailable as exc:
                if slot.draining:  # drained and exited (maybe while no master polled it)
                    self.down(slot, epoch, drained=True)
                    continue
                log.warning(
                    "node %s %s: %s",
                    slot.link.address,
                    "still suspect" if slot.suspect else "unreachable",
                    exc,
                    extra={"node": slot.link.address},
                )
                self.mark_failed(slot)

    def mark_failed(self, slot: NodeSlot) -> None:
        self.store.update_node(
            slot.load.id,
            state=NodeState.SUSPECT if slot.suspect else NodeState.UNREACHABLE,
            last_error=slot.link.last_error,
            failures=slot.link.failures,
        )

    def connected(self, slot: NodeSlot, epoch: int, info: AgentInfo) -> None:
        """The agent answered ``init``: reconcile, keep what a suspect node still holds."""
        try:
            self._reconcile(slot, epoch, info.queued)
            if slot.suspect:
                self._recover(slot, epoch)
        except AgentUnavailable:
            self.mark_failed(slot)
            return
        if slot.suspect:
            log.warning(
                "node %s answers again: no longer suspect (%d executions kept)",
                slot.link.address,
                len(self.book.flights[slot.id]),
                extra={"node": slot.link.address},
            )
            slot.suspect_since = None
        families = info.families
        slot.wrong_version = {}
        slot.unchecked = {name: fam.version for name, fam in families.items()}
        slot.families = set(families)
        slot.idempotent = {name for name, fam in families.items() if fam.idempotent}
        slot.async_families = {name for name, fam in families.items() if fam.is_async}
        slot.async_slots = info.async_slots
        slot.load.slots = info.slots
        slot.traces = info.traces
        self.store.update_node(
            slot.load.id,
            state=NodeState.DRAINING if slot.draining else NodeState.ACTIVE,
            last_seen=utcnow(),
            last_error=None,
            failures=0,
            slots=slot.load.slots,
            families=info.family_table(),
        )
        self.store.record_ops(slot.load.id, info.ops)  # where scrapers find its /metrics
        log.info(
            "node %s connected (%d slots)",
            slot.link.address,
            slot.load.slots,
            extra={"node": slot.link.address},
        )

    def _same_version(self, slot: NodeSlot, name: str) -> bool:
        """Checked once per connection, when a job of ``name`` may first go to ``slot``:
        the agent runs the family at the version this master knows (or it knows none);
        else it is not sent there."""
        theirs = slot.unchecked.pop(name)
        known = self.versions.get(name)
        if known is None or theirs == known:
            return True
        slot.wrong_version[name] = theirs
        slot.families.discard(name)
        log.error(
            "node %s has family %s at version %s, this master knows version %s: "
            "no %s jobs go there until both run the same version",
            slot.link.address,
            name,
            theirs or "?",
            known,
            name,
            extra={"node": slot.link.address, "family": name},
        )
        return False

    def _init_settings(self) -> str:
        """What ``init`` tells an agent: who we are, our cluster, and when we give up."""
        give_up = self.settings.call_timeout
        told: dict[str, object] = {
            "master": self.master_id,
            "cluster": self.cluster,
            "give_up": give_up,
            "lease_ttl": self.settings.lease_ttl,  # the agent's fence hold must outlast it
        }
        if self.led is not None:
            told["families"] = self.led
        return json.dumps(told)

    def _reconcile(self, slot: NodeSlot, epoch: int, queued: tuple[int, ...]) -> None:
        """Cancel on a (re)connected agent what it queues but the log has settled.

        Those are executions given up on (lost with the node, timed out, taken back)
        and maybe run elsewhere since; the agent starts nothing until this call.
        """
        self.ledger.writer.flush()  # outcomes decided in memory are in the log before we ask
        given_up = sorted(self.store.settled(list(queued)))
        slot.link.cancel(epoch, given_up)
        if given_up:
            log.warning(
                "node %s still queued %d executions given up on: cancelled there",
                slot.link.address,
                len(given_up),
            )

    def _recover(self, slot: NodeSlot, epoch: int) -> None:
        """A suspect node answers again: executions its agent no longer holds (it was
        restarted, say) are lost and their jobs placed again; the others stay."""
        flying = list(self.book.flights[slot.id])
        if not flying:
            return
        held = set(slot.link.held(epoch, flying))
        rows = []
        for exec_id in flying:
            if exec_id in held:
                continue
            # IN_FLIGHT -> WAITING, the transition of an execution given back unstarted.
            closed = self.book.take_back(slot.id, exec_id)
            if closed is not None:
                rows.append(
                    execution_row(
                        closed.exec_id,
                        closed.sent,
                        ExecState.LOST,
                        epoch,
                        backup=closed.backup,
                        error="not held by the agent when it answered again",
                    )
                )
        self.ledger.commit(rows)

    # -- suspect, then gone: jodl/master/suspects.py ---------------------------------------

    def down(self, slot: NodeSlot, epoch: int, gone: bool = False, drained: bool = False) -> None:
        """A call failed: the node is suspect (its jobs stay with it for now). Removed
        (``gone``): its jobs (sent or not) go back to be placed. A drained agent exits
        once it handed everything over (its failed call says so): its node is removed."""
        drained = drained or (slot.draining_heard and not gone)
        if drained:
            gone = slot.removed = True
            self.store.remove_node(slot.link.address)
            log.warning("node %s drained and gone: removed", slot.link.address)
        if gone:
            self.lose(slot, epoch, "node removed")
            slot.suspect_since = None
            slot.link.close()
            if drained:
                self.parts.node_gone(slot.load.id)
            return
        if slot.link.faulty:  # it answers, wrongly: nothing it holds is trusted
            slot.link.faulty = False
            self.lose(slot, epoch, f"node faulty: {slot.link.last_error}")
        if slot.suspect_since is None:
            slot.suspect_since = time.monotonic()
            slot.silent_since = slot.link.last_call
            log.warning(
                "node %s suspect: %s",
                slot.link.address,
                slot.link.last_error,
                extra={"node": slot.link.address},
            )
        slot.link.close()
        self.mark_failed(slot)

    def lose(self, slot: NodeSlot, epoch: int, reason: str) -> None:
        """Its executions are lost (logged), its jobs wait to be placed again."""
        lost = [
            execution_row(c.exec_id, c.sent, ExecState.LOST, epoch, backup=c.backup, error=reason)
            for c in self.book.lose(slot.load.id)
        ]
        if lost:
            log.warning(
                "node %s: %d executions lost (%s)",
                slot.link.address,
                len(lost),
                reason,
                extra={"node": slot.link.address},
            )
        slot.take_acks()
        self.ledger.commit(lost)
        if lost:
            failpoint.hit("lost_queued")  # handed to the log writer, maybe not committed

    def call(
        self,
        slot: NodeSlot,
        epoch: int,
        method: Callable[Concatenate[AgentLink, _P], _R],
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> _R | None:
        """``method`` of the agent client on ``slot``'s link; None (and the node down) if
        the agent is unreachable. :class:`Fenced` (a newer master took over) passes
        through: the loop stops."""
        try:
            return method(slot.link, *args, **kwargs)
        except Fenced:
            raise
        except AgentUnavailable:
            self.down(slot, epoch)
            return None

    def call_each(self, epoch: int, work: Mapping[int, Callable[[], _R]]) -> dict[int, _R | None]:
        """Each node's call of ``work`` (on its link), all at once on the call pool; by
        node, its reply, or None (and the node down) if the agent is unreachable.
        :class:`Fenced` passes through: the loop stops."""
        out: dict[int, _R | None] = {}
        for node_id, reply in self.calls.each(work).items():
            try:
                out[node_id] = reply.get()
            except Fenced:
                raise
            except AgentUnavailable:
                self.down(self.slots[node_id], epoch)
                out[node_id] = None
        return out

    def cancel(self, slot: NodeSlot, epoch: int, exec_ids: list[int]) -> None:
        """Cancel executions on the agent (queued ones never start; a result is dropped)."""
        if exec_ids:
            self.call(slot, epoch, AgentLink.cancel, epoch, exec_ids)

    def close(self) -> None:
        """Stop the call threads (a reconnect in flight ends by its timeout)."""
        self.calls.close()

    def flush_acks(self, epoch: int) -> None:
        for slot in self.slots.values():
            if slot.acks and slot.usable:
                try:
                    slot.link.ack(epoch, slot.take_acks())
                except Fenced:
                    raise
                except AgentUnavailable:
                    self.down(slot, epoch)
