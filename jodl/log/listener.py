"""PostgreSQL's wake-up calls: a LISTEN connection, and the on-demand queue's channel.

An enqueue ``NOTIFY``s :data:`CHANNEL` in its transaction
(:meth:`jodl.log.queue_sql.QueueSQL.notify`); a consumer waiting for due jobs
holds one :class:`Listener` and is woken when a notification arrives. Ended
on-demand jobs have a channel of their own (:mod:`jodl.log.notices`).
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import Engine

log = logging.getLogger("jodl.queue")

#: The PostgreSQL channel enqueues notify (payload: the family name).
CHANNEL = "jodl_queue"


class Listener:
    """A dedicated autocommit connection LISTENing on ``channel`` (:data:`CHANNEL`)."""

    def __init__(self, engine: Engine, channel: str = CHANNEL) -> None:
        raw = engine.raw_connection()
        # Taken before detach(): a detached pool proxy no longer names its driver connection.
        conn = raw.driver_connection
        assert conn is not None
        self.conn: Any = conn
        raw.detach()  # never returned to the pool with a LISTEN on it
        self._raw = raw
        try:
            self.conn.autocommit = True
            self.conn.execute(f"LISTEN {channel}")
        except Exception:
            raw.close()
            raise
        self.broken = False

    def wait(self, timeout: float) -> bool:
        """True when at least one notification arrived within ``timeout`` s (drains them)."""
        try:
            got = False
            for _ in self.conn.notifies(timeout=timeout, stop_after=1):
                got = True
            if got:
                for _ in self.conn.notifies(timeout=0):
                    pass
            return got
        except Exception as exc:  # noqa: BLE001 - a dropped connection: reconnect later
            log.warning("queue LISTEN connection failed: %s", exc)
            self.close()
            return True  # look once, then poll until a new listener is up

    def payloads(self, timeout: float) -> list[str]:
        """The payloads of the notifications arriving within ``timeout`` s (the first one
        waited for, the rest drained); raises when the connection failed."""
        out = [n.payload for n in self.conn.notifies(timeout=timeout, stop_after=1)]
        if out:
            out += [n.payload for n in self.conn.notifies(timeout=0)]
        return out

    def close(self) -> None:
        """Close the connection; the listener is broken from then on."""
        self.broken = True
        try:
            # Invalidated, not closed: a lost connection has no transaction to roll back.
            self._raw.invalidate()
        except Exception:  # noqa: BLE001
            pass
