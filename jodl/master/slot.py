"""One node's agent as the master's loop sees it (:class:`NodeSlot`), and what the
helpers of the node table use of it (:class:`NodeTable`), so that they need not import
the table: :mod:`.drain`, :mod:`.suspects` and :mod:`.reloads` work on any object of
that shape, :class:`~jodl.master.nodes.Nodes` being the one the master has."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..agent.client import AgentLink
from ..agent.replies import AgentInfo
from ..log.store import Store
from ..placement import Knowledge, NodeLoad
from ..settings.config import Settings
from .book import JobBook
from .calls import Outcome


@dataclass
class NodeSlot:
    """The master's view of one node's agent during the loop (its jobs are in the book)."""

    link: AgentLink
    load: NodeLoad
    #: Families the agent runs (at the version this master knows, see ``wrong_version``).
    families: set[str] = field(default_factory=set)
    #: Execution ids whose outcome is committed: acknowledged on the next call.
    #: The log writer adds to it from its thread, hence the lock.
    acks: list[int] = field(default_factory=list)
    ack_lock: threading.Lock = field(default_factory=threading.Lock)
    #: Execution ids whose outcome was collected and is not acknowledged yet. The agent
    #: hands each to a session once, so they come again only on a new connection (after
    #: a failed call), and then these repeats are skipped.
    reported: set[int] = field(default_factory=set)
    removed: bool = False
    #: Past a family's timeout: no new jobs until it reports a result or runs nothing.
    late: bool = False
    #: Families the agent runs as coroutines, and how many at once.
    async_families: set[str] = field(default_factory=set)
    async_slots: int = 0
    #: Moving mean of the durations this node reported (seconds); None before any.
    recent_duration: float | None = None
    #: Families whose class on this agent declares itself idempotent (backups allowed).
    idempotent: set[str] = field(default_factory=set)
    #: family -> the version the agent reported, for those another version than known.
    wrong_version: dict[str, str] = field(default_factory=dict)
    #: family -> the version the agent reported, not yet checked (:mod:`.versions`).
    unchecked: dict[str, str] = field(default_factory=dict)
    #: Drains (``jodl node drain`` or SIGTERM on the agent): nothing new is sent there,
    #: its results are still collected; once its agent exits the node is removed.
    draining: bool = False
    #: The agent said it drains (the log's DRAINING state is then relayed no more).
    draining_heard: bool = False
    #: A reconnect running in the background (the link is not used meanwhile).
    opening: Future[Outcome[AgentInfo]] | None = None
    #: Monotonic time of its first failed call while suspect; None when not suspect.
    suspect_since: float | None = None
    #: Monotonic time of the last call sent before it became suspect: its agent has
    #: heard nothing since (a reconnect's ``init`` pauses the agent, starting nothing).
    silent_since: float = 0.0
    #: Its agent has traces on (``init`` said so): sends carry the jobs' trace contexts.
    traces: bool = False

    @property
    def id(self) -> int:
        return self.load.id

    def add_acks(self, ids: list[int]) -> None:
        with self.ack_lock:
            self.acks.extend(ids)

    def take_acks(self) -> list[int]:
        with self.ack_lock:
            acks, self.acks = self.acks, []
        self.reported.difference_update(acks)
        return acks

    def observe(self, durations: list[float]) -> None:
        if not durations:
            return
        mean = sum(durations) / len(durations)
        if self.recent_duration is None:
            self.recent_duration = mean
        else:
            self.recent_duration = 0.7 * self.recent_duration + 0.3 * mean

    @property
    def usable(self) -> bool:
        return self.link.connected and not self.removed and self.opening is None

    @property
    def suspect(self) -> bool:
        return self.suspect_since is not None


class NodeTable(Protocol):
    """What the node table's helpers use of it (see :class:`~jodl.master.nodes.Nodes`)."""

    slots: dict[int, NodeSlot]
    store: Store
    settings: Settings
    book: JobBook
    knowledge: Knowledge

    def call(self, slot: NodeSlot, epoch: int, method: Callable[..., Any], *args: Any) -> Any: ...

    def call_each(self, epoch: int, work: Mapping[int, Callable[[], Any]]) -> dict[int, Any]: ...

    def candidates(self, family: str) -> list[NodeLoad]: ...

    def lose(self, slot: NodeSlot, epoch: int, reason: str) -> None: ...

    def mark_failed(self, slot: NodeSlot) -> None: ...

    def reinit(self, slot: NodeSlot, epoch: int) -> None: ...


__all__ = ["NodeSlot", "NodeTable"]
