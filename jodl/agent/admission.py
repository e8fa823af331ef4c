"""Admission to an agent's handshake: a cap, a share per address, room kept for masters.

Before a peer authenticates, the agent knows nothing of it but its address, and each
connection in the handshake holds a thread for up to ``JODL_HANDSHAKE_TIMEOUT``. So
that no single peer holding silent connections can keep a master out (a
pre-authentication denial of service), :class:`HandshakeSlots` admits connections
by three numbers derived from ``JODL_HANDSHAKE_LIMIT`` (``limit``):

* ``limit`` connections in the handshake at once, all peers together: the agent's
  threads stay bounded;
* ``per_address`` = ``max(1, limit // 4)`` from one address: a master has one
  connection per agent, and a reconnect, ``jodl status`` or a standby on the same
  host add a few; one address alone cannot take more than a quarter;
* ``reserved`` = ``limit // 4`` that only *known* addresses may use: addresses a peer
  authenticated from before (the masters that served this agent; the newest
  :data:`KNOWN_MAX` are remembered). Peers never seen, from however many
  addresses, leave that room free, so a master gets back in while the agent is
  flooded. A master that never reached this agent before competes with unknown
  peers (the per-address share still keeps one flooding address from filling the rest).

A connection from ``address`` is admitted when::

    held[address] < per_address  and  open < limit - (0 if address is known else reserved)
"""

from __future__ import annotations

import threading
from collections import OrderedDict

#: Addresses remembered as known (a cluster has a few masters; a bound keeps a peer
#: that authenticates from ever new addresses from growing the table).
KNOWN_MAX = 64


class HandshakeSlots:
    """Admission to the handshake: :meth:`take`, :meth:`give_back`, :meth:`authenticated`."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("the handshake limit must be at least 1")
        self.limit = limit
        self.per_address = max(1, limit // 4)
        self.reserved = limit // 4
        # Connections in the handshake now, in all and per address (entries removed at 0).
        self._open = 0
        self._held: dict[str, int] = {}
        # Addresses that authenticated before, least recently authenticated first.
        self._known: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, address: str) -> bool:
        """Admit one connection from ``address`` to the handshake (False: turn it away)."""
        with self._lock:
            room = self.limit if address in self._known else self.limit - self.reserved
            if self._held.get(address, 0) >= self.per_address or self._open >= room:
                return False
            self._held[address] = self._held.get(address, 0) + 1
            self._open += 1
            return True

    def give_back(self, address: str) -> None:
        """The handshake of a connection from ``address`` ended (either way)."""
        with self._lock:
            self._open -= 1
            held = self._held.pop(address, 0) - 1
            if held > 0:
                self._held[address] = held

    def authenticated(self, address: str) -> None:
        """A peer at ``address`` passed the handshake: the address is known from now on."""
        with self._lock:
            self._known[address] = None
            self._known.move_to_end(address)
            while len(self._known) > KNOWN_MAX:
                self._known.popitem(last=False)


__all__ = ["KNOWN_MAX", "HandshakeSlots"]
