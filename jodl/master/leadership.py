"""Which scopes this master leads, kept with leases in the database (docs/architecture.md).

A *scope* is what one leader runs alone. Each scope has a lease row (holder, epoch,
expiry) in ``jodl_master_lease``; the epoch grows with every change of holder and is
the fencing token stamped on agent calls. Live masters register a heartbeat in
``jodl_master_node``. A free (or expired) scope is taken by the master rendezvous
hashing picks among live masters, so adding or removing a master moves only its
share; a live lease is never taken unless ``takeover``.

Agents keep one session and one epoch per agent, so today the master leads one
scope, :data:`WHOLE`: every family and the on-demand queue. Standby masters poll
until it is free; the database decides (one transaction with a row lock) which
one of them takes it.

The leader renews every TTL/3 from a thread of its own (a long step does not let
the lease lapse; a stopped process renews nothing). When the last renewal is
:data:`STOP_SHARE` of the TTL old, the loop stops dispatching
(:class:`~jodl.exceptions.Fenced`), before its lease can expire and a standby take over.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time

from ..exceptions import Fenced, LeaseHeld
from ..log.lease import holder_gone
from ..log.store import Store

log = logging.getLogger("jodl.master")

#: The scope of a master that leads the whole database (families and queue).
WHOLE = "master"
#: Share of the TTL after the last successful renewal at which a leader stops
#: dispatching: two thirds, so it has stopped a third of a TTL before a standby may
#: take its lease (clocks of one host, or NTP-synchronised hosts, differ far less).
STOP_SHARE = 2 / 3
#: Share of the TTL between two renewals: a third, so two may fail before the stop.
RENEW_SHARE = 1 / 3
#: Share of the TTL between two looks of a standby at the leases: a takeover waits at
#: most this long after the lease expired.
POLL_SHARE = 1 / 10


def rendezvous(scope: str, masters: list[str]) -> str | None:
    """The master that leads ``scope`` among ``masters`` (highest random weight)."""
    if not masters:
        return None
    return max(masters, key=lambda m: hashlib.sha256(f"{scope}\0{m}".encode()).digest())


class Leadership:
    """The leases this master holds: taken, renewed in time, released on a clean stop.

    ``led``: scope -> epoch of every scope this master leads now.
    """

    def __init__(
        self,
        store: Store,
        name: str,
        ttl: float,
        takeover: bool = False,
        scopes: tuple[str, ...] = (WHOLE,),
    ) -> None:
        self.store = store
        self.name = name
        self.ttl = ttl
        self.takeover = takeover
        self.scopes = scopes
        self.led: dict[str, int] = {}
        #: monotonic time of the last successful renewal of every led scope.
        self.renewed = 0.0
        self._beat = 0.0
        #: Why the renewer found a scope taken over (then the master stops), or None.
        self._lost: str | None = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    @property
    def poll_every(self) -> float:
        return self.ttl * POLL_SHARE

    def role(self) -> str:
        return "leader" if self.led else "standby"

    def heartbeat(self, force: bool = False) -> None:
        """Register this master as live (every TTL/3 at most)."""
        now = time.monotonic()
        if force or now - self._beat >= self.ttl * RENEW_SHARE:
            self.store.masters.heartbeat(self.name, self.ttl, self.role(), tuple(self.led))
            self._beat = now

    def take(self) -> int:
        """Take :data:`WHOLE` now or raise :class:`LeaseHeld` (a one-shot ``jodl run``)."""
        try:
            epoch = self.store.acquire_lease(self.name, WHOLE, force=self.takeover, ttl=self.ttl)
        except LeaseHeld as exc:
            if self.store.dialect != "sqlite":
                raise
            raise LeaseHeld(
                exc.holder,
                exc.seconds_left,
                "; a SQLite database has one master: use PostgreSQL for standby masters",
            ) from None
        self.led[WHOLE] = epoch
        self.renewed = time.monotonic()
        self.heartbeat(force=True)
        return epoch

    def poll(self) -> dict[str, int]:
        """A standby's look: take every free scope rendezvous hashing gives this master.

        Returns the scopes taken now, with their epochs.
        """
        self.heartbeat()
        # A master on this host whose process is gone (killed) is not waited for.
        live = [m for m in self.store.masters.live() if not holder_gone(m)]
        if self.name not in live:
            live.append(self.name)
        taken: dict[str, int] = {}
        for scope in self.scopes:
            if scope in self.led:
                continue
            if not self.takeover and rendezvous(scope, live) != self.name:
                # Another live master's share: ours only once that master stops
                # heartbeating (then it leaves ``live``).
                continue
            try:
                epoch = self.store.acquire_lease(
                    self.name, scope, force=self.takeover, ttl=self.ttl
                )
            except LeaseHeld:
                continue
            taken[scope] = self.led[scope] = epoch
            log.warning("master %s leads %s now (epoch %d)", self.name, scope, epoch)
        if taken:
            self.renewed = time.monotonic()
            self.heartbeat(force=True)
        return taken

    @property
    def lost(self) -> str | None:
        """Why a led scope was found taken over by another master, or None."""
        return self._lost

    def keep(self) -> None:
        """Called before every step: :class:`Fenced` when a led scope was taken over, or
        when the last renewal is :data:`STOP_SHARE` of the TTL old (stop before it
        expires). The renewals themselves run in a thread (:meth:`_renew_loop`), so a
        long step (resuming a large run) does not let the lease lapse."""
        if self._lost is not None:
            self.led.clear()
            raise Fenced(self._lost)
        stale = time.monotonic() - self.renewed
        if self.led and stale >= self.ttl * STOP_SHARE and not self._renew_late(stale):
            self.led.clear()
            raise Fenced(
                f"could not renew the lease for {STOP_SHARE:.0%} of its TTL: "
                "stopped dispatching before it could expire"
            )
        if self.led and self._renewer is None:
            self._stop.clear()
            self._renewer = threading.Thread(
                target=self._renew_loop, name="lease-renewer", daemon=True
            )
            self._renewer.start()

    def _renew_late(self, stale: float) -> bool:
        """The last renewal is too old to dispatch on (the process was stopped, say):
        renew now, before any step. Our epoch unchanged means no other master took the
        scope meanwhile (taking raises the epoch), so leading on is safe; otherwise, or
        when the database does not answer, we stop."""
        try:
            for scope, epoch in list(self.led.items()):
                if not self.store.renew_lease(self.name, epoch, scope, ttl=self.ttl):
                    return False
        except Exception as exc:  # noqa: BLE001 - no renewal: stop dispatching
            log.warning("could not renew the lease late (%s)", exc)
            return False
        log.warning("lease renewed %.1fs after the last renewal: still the leader", stale)
        self.renewed = time.monotonic()
        return True

    def _renew_loop(self) -> None:
        """Renew every led scope every TTL/3, with its own connection, until stopped."""
        while not self._stop.wait(self.ttl * RENEW_SHARE):
            try:
                for scope, epoch in list(self.led.items()):
                    if not self.store.renew_lease(self.name, epoch, scope, ttl=self.ttl):
                        self._lost = f"another master took over {scope!r} (epoch {epoch} is old)"
                        return
                self.renewed = time.monotonic()
                self.heartbeat(force=True)
            except Exception as exc:  # noqa: BLE001 - the database may come back in time
                log.warning("could not renew the lease (%s); trying again", exc)

    def release(self) -> None:
        """End every led lease now and leave the live masters (a clean stop)."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=30)
            self._renewer = None
        for scope, epoch in list(self.led.items()):
            self.store.release_lease(epoch, scope)
        self.led.clear()
        self.store.masters.leave(self.name)


__all__ = ["WHOLE", "Leadership", "rendezvous"]
