"""Which master leads: the master lease, its epochs, and the cluster's identity."""

from __future__ import annotations

import datetime as dt
import os
import secrets
import socket

from sqlalchemy import Connection, Engine, select, text, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import sessionmaker

from ..exceptions import Fenced, LeaseHeld
from .models import Cluster, MasterLease, utcnow

#: Seconds a lease lasts without renewal unless told otherwise (``JODL_LEASE_TTL``
#: sets the running master's: see :class:`jodl.master.leadership.Leadership`).
LEASE_SECONDS = 5.0
#: Seconds between two renewals by the running master: a third of the lease, so two
#: renewals may fail (a slow disk, a busy database) before it expires.
LEASE_RENEW = LEASE_SECONDS / 3


def holder_gone(holder: str) -> bool:
    """True when ``holder`` (``HOST:PID...``, a master's name) is a process on this host
    that no longer exists, so its lease need not be waited for."""
    host, _, rest = holder.partition(":")
    pid = rest.split(":", 1)[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


#: Milliseconds a fenced write transaction may sit idle (its process stopped) before
#: PostgreSQL ends it, releasing the lease row it shares so a standby can take over.
FENCE_IDLE_MS = 1000
#: Milliseconds a standby waits for the lease row's lock before trying again later.
TAKE_LOCK_MS = 500


def check_fence(conn: Connection, epoch: int, name: str = "master") -> None:
    """In a writing transaction: :class:`Fenced` unless lease ``name`` still has ``epoch``.

    ``FOR SHARE`` holds the lease row until the commit, so a takeover (``FOR UPDATE``
    in :meth:`Leases.acquire`) waits for writes in flight, and every write after it
    sees the new epoch: a stalled leader that wakes writes nothing (PostgreSQL; a
    SQLite file has one master). A transaction left idle by a stopped process ends
    after :data:`FENCE_IDLE_MS`, so it cannot hold the takeover back.
    """
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL idle_in_transaction_session_timeout = {FENCE_IDLE_MS}")
    found = conn.scalar(
        select(MasterLease.epoch).where(MasterLease.name == name).with_for_update(read=True)
    )
    if found is not None and found != epoch:
        raise Fenced(f"another master took over (epoch {found}): epoch {epoch} writes nothing")


class Leases:
    """The master lease (one row per lease name) and the cluster id."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)

    def acquire(
        self,
        holder: str,
        name: str = "master",
        force: bool = False,
        ttl: float = LEASE_SECONDS,
    ) -> int:
        """Take the lease and return the new epoch (older masters are fenced).

        A lease another holder renewed less than :data:`LEASE_SECONDS` ago is live:
        :class:`LeaseHeld` unless ``force`` (an explicit takeover). A holder on this
        host whose process is gone (killed) counts as expired at once.
        """
        with self.sessions() as s, s.begin():
            if self.engine.dialect.name == "postgresql":
                s.execute(text(f"SET LOCAL lock_timeout = {TAKE_LOCK_MS}"))
            try:
                lease = s.get(MasterLease, name, with_for_update=True)
            except OperationalError as exc:  # a leader's write holds it: not free now
                raise LeaseHeld(name, TAKE_LOCK_MS / 1000) from exc
            now = utcnow()
            if lease is None:
                lease = MasterLease(name=name, holder=holder, epoch=0, expires_at=now)
                s.add(lease)
            elif (
                not force
                and lease.holder != holder
                and lease.expires_at > now
                and not holder_gone(lease.holder)
            ):
                raise LeaseHeld(lease.holder, (lease.expires_at - now).total_seconds())
            lease.epoch += 1
            lease.holder = holder
            lease.expires_at = now + dt.timedelta(seconds=ttl)
            s.flush()
            return lease.epoch

    def holder(self, name: str = "master") -> str | None:
        """Who holds a live lease (renewed, its process not known to be gone); None: nobody."""
        with self.sessions() as s:
            lease = s.get(MasterLease, name)
            if lease is None or lease.expires_at <= utcnow() or holder_gone(lease.holder):
                return None
            return lease.holder

    def renew(self, epoch: int, name: str = "master", ttl: float = LEASE_SECONDS) -> bool:
        """Extend the lease of ``epoch``; False when another master has taken it (fenced)."""
        with self.engine.begin() as conn:
            res = conn.execute(
                update(MasterLease)
                .where(MasterLease.name == name, MasterLease.epoch == epoch)
                .values(expires_at=utcnow() + dt.timedelta(seconds=ttl))
            )
            return res.rowcount == 1

    def leases(self) -> list[tuple[str, str, int, dt.datetime]]:
        """Every lease row: (scope, holder, epoch, expires_at), by scope (for status)."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(
                    MasterLease.name, MasterLease.holder, MasterLease.epoch, MasterLease.expires_at
                ).order_by(MasterLease.name)
            ).all()
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    def release(self, epoch: int, name: str = "master") -> None:
        """End the lease of ``epoch`` now (a clean stop): the next master need not wait."""
        with self.engine.begin() as conn:
            conn.execute(
                update(MasterLease)
                .where(MasterLease.name == name, MasterLease.epoch == epoch)
                .values(expires_at=utcnow())
            )

    def cluster_id(self) -> str:
        """This database's cluster id, drawn on first use (agents bind their memory to it)."""
        with self.sessions() as s:
            found = s.scalar(select(Cluster.id).order_by(Cluster.created_at).limit(1))
        if found is not None:
            return found
        try:
            with self.sessions() as s, s.begin():
                s.add(Cluster(id=secrets.token_hex(16), created_at=utcnow()))
        except IntegrityError:
            pass  # the same moment in another master: read theirs
        with self.sessions() as s:
            found = s.scalar(select(Cluster.id).order_by(Cluster.created_at, Cluster.id).limit(1))
        assert found is not None
        return found
