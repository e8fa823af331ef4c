"""Event-stream slots: a shared pool, a cap per client, and the operators' own pool.

Each open event stream holds a thread of the WSGI server. Streams of ordinary
clients share ``JODL_WEB_MAX_STREAMS`` slots, and one client (a signed-in user,
else an address) holds at most ``JODL_WEB_STREAMS_PER_CLIENT`` of them, so a
single visitor cannot take them all. Operators' live views draw from their own
pool (``JODL_WEB_OPERATOR_STREAMS``), which nobody else can fill.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class Slot:
    """One held stream slot: whose, and from which pool."""

    client: str
    operator: bool


class StreamSlots:
    """Counts open streams per pool and per client; :meth:`take` and :meth:`give_back`."""

    def __init__(self, shared: int, per_client: int, operators: int) -> None:
        self.limits = {False: shared, True: operators}
        self.per_client = per_client
        self._open = {False: 0, True: 0}
        # client -> streams it holds open (entries removed at zero)
        self._clients: dict[str, int] = {}
        self._lock = threading.Lock()

    def take(self, client: str, operator: bool = False) -> Slot | None:
        """A slot for ``client`` (from the operators' pool if ``operator``), or None."""
        with self._lock:
            held = self._clients.get(client, 0)
            if held >= self.per_client or self._open[operator] >= self.limits[operator]:
                return None
            self._clients[client] = held + 1
            self._open[operator] += 1
            return Slot(client, operator)

    def give_back(self, slot: Slot) -> None:
        with self._lock:
            self._open[slot.operator] -= 1
            held = self._clients.pop(slot.client, 0) - 1
            if held > 0:
                self._clients[slot.client] = held

    def open(self) -> int:
        """Streams open now, over both pools."""
        with self._lock:
            return sum(self._open.values())
