"""A node's "last seen" in the log, kept moving while the master talks to its agent.

Every call an agent answers well stamps its link (``AgentLink.answered``, a monotonic
time: no write per call). At most once per :data:`LastSeen.PERIOD` the master writes
the nodes heard from since the last write, in one statement for all of them, so the
log's ``last_seen`` (``jodl node list``, ``jodl status``, the operators' view) is never
older than the period while a node works, at one small write per period whatever the
number of nodes and calls.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable

from sqlalchemy.exc import SQLAlchemyError

from ..log.models import utcnow
from ..log.store import Store
from .slot import NodeSlot

log = logging.getLogger("jodl.master")


class LastSeen:
    """Writes which nodes answered, at most once per :data:`PERIOD` (:meth:`write`)."""

    #: Seconds between two writes: what a person reading "last seen" can tell apart
    #: (as often as the default lease renewal), and one UPDATE per 5 s is nothing for
    #: the database beside the master's result batches.
    PERIOD = 5.0

    def __init__(self, store: Store) -> None:
        self.store = store
        self.next_at = 0.0
        #: Monotonic time of the last write: links answered after it are written next.
        self.since = 0.0

    def write(self, slots: Iterable[NodeSlot]) -> None:
        """Stamp ``last_seen`` now on the nodes whose agent answered since the last write."""
        now = time.monotonic()
        if now < self.next_at:
            return
        self.next_at = now + self.PERIOD
        heard = [slot.load.id for slot in slots if slot.link.answered > self.since]
        if not heard:
            return
        try:
            self.store.nodes_seen(heard, utcnow())
        except SQLAlchemyError as exc:  # a cosmetic write: the loop goes on, next period retries
            log.warning("could not record when nodes were last seen: %s", exc)
            return
        self.since = now


__all__ = ["LastSeen"]
