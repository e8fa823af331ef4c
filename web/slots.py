"""Event-stream slots: a shared pool, a cap per client, and the operators' own pool.

Each open event stream holds a thread of the WSGI server. Streams of ordinary
clients share ``JODL_WEB_MAX_STREAMS`` slots; a signed-in user holds at most
``JODL_WEB_STREAMS_PER_CLIENT`` of them, and so does a client address whichever
accounts it uses, so neither one visitor nor one machine with many accounts can
take them all. Operators' live views draw from their own pool
(``JODL_WEB_OPERATOR_STREAMS``), which nobody else can fill; there an operator
counts as a user only (on ``jodl up`` every browser shares one loopback address).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    """One held stream slot: whom it counts against, and from which pool."""

    #: The user's key and the address's key, or one of them (an anonymous client is
    #: its address; an operator's stream counts against the operator only).
    keys: frozenset[str]
    operator: bool


class StreamSlots:
    """Counts open streams per pool, per user and per address; :meth:`take`, :meth:`give_back`."""

    def __init__(self, shared: int, per_client: int, operators: int) -> None:
        self.limits = {False: shared, True: operators}
        self.per_client = per_client
        self._open = {False: 0, True: 0}
        # user or address key -> streams it holds open (entries removed at zero)
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, client: str, address: str, operator: bool = False) -> Slot | None:
        """A slot for ``client`` (a user's key, or the address's for a visitor) at
        ``address`` (the address's key), from the operators' pool if ``operator``; None
        when the pool is full or the user or the address holds its share already."""
        keys = frozenset({client} if operator else {client, address})
        with self._lock:
            full = any(self._held.get(key, 0) >= self.per_client for key in keys)
            if full or self._open[operator] >= self.limits[operator]:
                return None
            for key in keys:
                self._held[key] = self._held.get(key, 0) + 1
            self._open[operator] += 1
            return Slot(keys, operator)

    def give_back(self, slot: Slot) -> None:
        with self._lock:
            self._open[slot.operator] -= 1
            for key in slot.keys:
                held = self._held.pop(key, 0) - 1
                if held > 0:
                    self._held[key] = held

    def open(self) -> int:
        """Streams open now, over both pools."""
        with self._lock:
            return sum(self._open.values())
