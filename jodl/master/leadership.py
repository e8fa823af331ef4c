"""Which scopes this master leads, kept with leases in the database (docs/architecture.md).

A *scope* is what one leader runs alone: a family (``family:NAME``: its cycles and
its on-demand jobs), or :data:`WHOLE`, everything at once (the one master of a SQLite
file, a one-shot ``jodl run``). Each scope has a lease row (holder, epoch, expiry) in
``jodl_master_lease``. Every take draws a new epoch from one counter and stamps it on
all the scopes the master leads, so a master has one epoch at a time, stamped on
its agent calls and checked by every write (:func:`jodl.log.lease.check_fence`).

Serving masters on PostgreSQL spread the families: each registers a heartbeat in
``jodl_master_node``, and a family is led by the live master rendezvous hashing
picks for it, so a master joining or leaving moves only its share. A master hands
a family to the master hashing picks once the family is idle (no run open, nothing
held): a family never moves in the middle of a run, except when its master stops
or dies, and then the next one resumes the run from the log. A live lease is never
taken unless ``takeover``.

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
from collections.abc import Callable, Iterable

from ..exceptions import Fenced, LeaseHeld
from ..log.lease import FAMILY, WHOLE, family_scope, holder_gone
from ..log.store import Store

log = logging.getLogger("jodl.master")
#: Share of the TTL after the last successful renewal at which a leader stops
#: dispatching: two thirds, so it has stopped a third of a TTL before a standby may
#: take its lease (clocks of one host, or NTP-synchronised hosts, differ far less).
STOP_SHARE = 2 / 3
#: Share of the TTL between two renewals: a third, so two may fail before the stop.
RENEW_SHARE = 1 / 3
#: Share of the TTL between two looks of a standby at the leases: a takeover waits at
#: most this long after the lease expired.
POLL_SHARE = 1 / 10
#: Seconds after a refused lease's expiry at which a standby looks again: the expiry
#: is compared with this host's clock, so a little later than it is enough.
EXPIRY_SLACK = 0.02


def rendezvous(scope: str, masters: list[str]) -> str | None:
    """The master that leads ``scope`` among ``masters`` (highest random weight)."""
    if not masters:
        return None
    return max(masters, key=lambda m: hashlib.sha256(f"{scope}\0{m}".encode()).digest())


class Leadership:
    """The leases this master holds: taken, renewed in time, released on a clean stop.

    ``led``: scope -> epoch of every scope this master leads now (one epoch for all).
    """

    def __init__(
        self,
        store: Store,
        name: str,
        ttl: float,
        takeover: bool = False,
    ) -> None:
        self.store = store
        self.name = name
        self.ttl = ttl
        self.takeover = takeover
        self.led: dict[str, int] = {}
        #: The epoch of every led scope (0 before the first take).
        self.epoch = 0
        #: monotonic time of the last successful renewal of every led scope.
        self.renewed = 0.0
        #: Where this master's ops endpoint listens ("" when it serves none), set by
        #: whoever serves it (:func:`jodl.ops.server.serve_master`): said in the heartbeat.
        self.ops = ""
        self._beat = 0.0
        #: Why the renewer found a scope taken over (then the master stops), or None.
        self._lost: str | None = None
        #: Monotonic times at which the soonest lease refused at the last take expires,
        #: and the soonest heartbeat of another live master (:meth:`next_look`).
        self._free_at: float | None = None
        self._lapse_at: float | None = None
        #: Taking and giving change ``led`` and the epoch under it; the renewer reads both.
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    @property
    def poll_every(self) -> float:
        return self.ttl * POLL_SHARE

    def next_look(self) -> float:
        """Seconds until the next look at the leases: every :attr:`poll_every`, but at
        once after the soonest expiry of a lease this master was refused or of another
        master's heartbeat (a hung leader's families are taken as its lease and its
        heartbeat lapse, not up to one poll later)."""
        now = time.monotonic()
        soon = [
            at
            for at in (self._free_at, self._lapse_at)
            if at is not None and at + EXPIRY_SLACK >= now  # else looked at then
        ]
        if not soon:
            return self.poll_every
        return min(self.poll_every, min(soon) - now + EXPIRY_SLACK)

    def role(self) -> str:
        return "leader" if self.led else "standby"

    def leads(self, family: str) -> bool:
        """Whether this master runs ``family`` (its scope, or everything)."""
        return WHOLE in self.led or family_scope(family) in self.led

    def families(self) -> list[str] | None:
        """The families this master leads, by name; None: every one (:data:`WHOLE`)."""
        if WHOLE in self.led:
            return None
        return sorted(scope[len(FAMILY) :] for scope in self.led if scope.startswith(FAMILY))

    def heartbeat(self, force: bool = False) -> None:
        """Register this master as live (every TTL/3 at most)."""
        now = time.monotonic()
        if force or now - self._beat >= self.ttl * RENEW_SHARE:
            self.store.masters.heartbeat(
                self.name, self.ttl, self.role(), tuple(self.led), self.ops
            )
            self._beat = now

    def take(self) -> int:
        """Take :data:`WHOLE` now or raise :class:`LeaseHeld` (a one-shot ``jodl run``)."""
        try:
            epoch = self.store.acquire_lease(self.name, WHOLE, force=self.takeover, ttl=self.ttl)
        except LeaseHeld as exc:
            self.refused(exc.seconds_left)
            if self.store.dialect != "sqlite":
                raise
            raise LeaseHeld(
                exc.holder,
                exc.seconds_left,
                "; a SQLite database has one master: use PostgreSQL for standby masters",
            ) from None
        with self._lock:
            self.led = {WHOLE: epoch}
            self.epoch = epoch
            self.renewed = time.monotonic()
        self.heartbeat(force=True)
        return epoch

    def live(self) -> list[str]:
        """The live masters (this one included): their heartbeats, less those of this
        host whose process is gone (killed), which are not waited for."""
        left = self.store.masters.live_for()
        live = [m for m in sorted(left) if not holder_gone(m)]
        others = [left[m] for m in live if m != self.name]
        # The live masters change when the first other heartbeat lapses (a hung master).
        self._lapse_at = time.monotonic() + min(others) if others else None
        if self.name not in live:
            live.append(self.name)
        return live

    def plan(
        self, families: Iterable[str], idle: Callable[[str], bool]
    ) -> tuple[list[str], list[str]]:
        """(families to take, families to hand over): those rendezvous hashing gives
        this master and it does not lead, and those it leads that hashing gives
        another live master and that are ``idle`` (no run open, nothing held)."""
        self.heartbeat()
        live = self.live()
        want, give = [], []
        for family in families:
            scope = family_scope(family)
            mine = self.takeover or rendezvous(scope, live) == self.name
            if scope not in self.led and WHOLE not in self.led and mine:
                want.append(family)
            elif scope in self.led and not mine and idle(family):
                give.append(family)
        return want, give

    def gain(self, families: Iterable[str]) -> list[str]:
        """Take the leases of ``families`` that are free (one new epoch for every led
        scope: only between steps, with the log writer flushed); the families taken.

        :class:`Fenced` when a scope this master leads was taken from it meanwhile.
        """
        wanted = [family_scope(f) for f in families]
        if not wanted:
            return []
        with self._lock:
            epoch, taken, held = self.store.take_leases(
                self.name, wanted, list(self.led), self.epoch, self.takeover, self.ttl
            )
            self.refused(min((left for _, left in held.values()), default=None))
            if taken:
                self.led = {scope: epoch for scope in (*self.led, *taken)}
                self.epoch = epoch
                self.renewed = time.monotonic()
        if not taken:
            return []
        self.heartbeat(force=True)
        names = [scope[len(FAMILY) :] for scope in taken]
        log.warning("master %s leads %s now (epoch %d)", self.name, ", ".join(sorted(names)), epoch)
        return names

    def refused(self, seconds_left: float | None) -> None:
        """A lease this master wants is held for ``seconds_left`` more (None: none is)."""
        self._free_at = None if seconds_left is None else time.monotonic() + seconds_left

    def give(self, families: Iterable[str]) -> None:
        """Hand ``families`` over: their leases end now, for the master hashing picks."""
        scopes = [family_scope(f) for f in families if family_scope(f) in self.led]
        if not scopes:
            return
        with self._lock:
            self.store.release_lease(self.epoch, scopes)
            for scope in scopes:
                del self.led[scope]
        self.heartbeat(force=True)
        log.warning(
            "master %s hands over %s", self.name, ", ".join(s[len(FAMILY) :] for s in scopes)
        )

    def poll(self, families: Iterable[str] = ()) -> list[str]:
        """A standby's look: take the free families rendezvous hashing gives this master;
        the families taken now."""
        want, _ = self.plan(families, lambda _family: False)
        return self.gain(want)

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
        renew now, before any step. Our epoch unchanged means no other master took a
        scope meanwhile (taking raises the epoch), so leading on is safe; otherwise, or
        when the database does not answer, we stop."""
        try:
            if not self._renew():
                return False
        except Exception as exc:  # noqa: BLE001 - no renewal: stop dispatching
            log.warning("could not renew the lease late (%s)", exc)
            return False
        log.warning("lease renewed %.1fs after the last renewal: still the leader", stale)
        return True

    def _renew(self) -> bool:
        """Renew every led scope at once; False when one was taken over."""
        with self._lock:
            if not self.led:
                return True
            if not self.store.renew_lease(self.name, self.epoch, list(self.led), ttl=self.ttl):
                return False
            self.renewed = time.monotonic()
            return True

    def _renew_loop(self) -> None:
        """Renew every led scope every TTL/3, with its own connection, until stopped."""
        while not self._stop.wait(self.ttl * RENEW_SHARE):
            try:
                if not self._renew():
                    self._lost = f"another master took over (epoch {self.epoch} is old)"
                    return
                self.heartbeat(force=True)
            except Exception as exc:  # noqa: BLE001 - the database may come back in time
                log.warning("could not renew the lease (%s); trying again", exc)

    def stop_renewing(self) -> None:
        """Stop the renewer thread; the leases stay until they expire."""
        self._stop.set()
        if self._renewer is not None:
            self._renewer.join(timeout=30)
            self._renewer = None

    def release(self, leave: bool = True) -> None:
        """End every led lease now; ``leave``: the live masters too (a clean stop, where
        a master that stands by again stays one of them)."""
        self.stop_renewing()
        if self.led:
            self.store.release_lease(self.epoch, list(self.led))
        self.led.clear()
        if leave:
            self.store.masters.leave(self.name)


__all__ = ["WHOLE", "Leadership", "rendezvous"]
