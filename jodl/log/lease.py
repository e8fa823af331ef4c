"""Which master leads what: the leases of scopes (a family, or everything), their
epochs, and the cluster's identity."""

from __future__ import annotations

import datetime as dt
import logging
import os
import secrets
import socket
from collections.abc import Sequence

from sqlalchemy import Connection, Engine, func, select, text, update
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import sessionmaker

from .. import failpoint
from ..exceptions import Fenced, LeaseHeld
from .models import Cluster, MasterLease, utcnow

log = logging.getLogger("jodl.master")

#: Seconds a lease lasts without renewal unless told otherwise (``JODL_LEASE_TTL``
#: sets the running master's: see :class:`jodl.master.leadership.Leadership`).
LEASE_SECONDS = 5.0


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
#: Milliseconds a standby waits for the lease rows' locks before trying again later.
TAKE_LOCK_MS = 500
#: Milliseconds a take (which locks every lease row) may sit idle, its process stopped,
#: before PostgreSQL ends it: bounded, so a master frozen in the middle of one cannot
#: hold every lease for as long as it is frozen; longer than a fenced write's, as takes
#: are rare and a live master's, slowed by its other threads, must not be ended.
TAKE_IDLE_MS = 3000
#: The lease of a master that leads everything (a SQLite file's, a one-shot run's).
WHOLE = "master"
#: The prefix of a family's lease: ``family:NAME``.
FAMILY = "family:"
#: The row whose epoch is the last one drawn. Every take draws the next one, so an
#: epoch names one master's term across all the scopes it leads.
COUNTER = "~epochs"
#: The holder of a lease given up or taken away: free for anyone.
VACANT = ""
#: The prefix of a writing transaction's ``application_name``, before its epoch.
WRITER = "jodl-epoch:"
#: Key of a connection's ``info``: the epoch its transaction proved (:func:`check_fence`).
CHECKED = "jodl_fence_checked"


def family_scope(family: str) -> str:
    """The lease scope of ``family``."""
    return FAMILY + family


def writer_name(epoch: int) -> str:
    """The ``application_name`` of a writing transaction of the master of ``epoch``."""
    return f"{WRITER}{epoch}"


#: The fence check on PostgreSQL: the transaction named, then a lease row of the epoch
#: share-locked (its epoch in the third column; NULL when there is none).
_NAMED_AND_HELD = text(
    f"WITH held AS (SELECT epoch FROM {MasterLease.__tablename__}"
    " WHERE epoch = :epoch AND name <> :counter LIMIT 1 FOR SHARE)"
    " SELECT set_config('idle_in_transaction_session_timeout', :idle, true),"
    " set_config('application_name', :name, true), (SELECT epoch FROM held)"
)


#: A take's limits on PostgreSQL: how long it waits for a lease row's lock, and how long
#: it may sit idle (its process stopped) before the server ends it.
_TAKE_LIMITS = text(
    "SELECT set_config('lock_timeout', :lock, true),"
    " set_config('idle_in_transaction_session_timeout', :idle, true)"
)


def check_fence(conn: Connection, epoch: int) -> None:
    """In a writing transaction: :class:`Fenced` unless a lease row still has ``epoch``.

    All the scopes a master leads carry its one epoch, and taking any of them from it
    (after it expired, or with ``--takeover``) re-stamps all of them (:meth:`Leases.take`),
    so one row found is enough. ``FOR SHARE`` holds that row until the commit, so a
    takeover (``FOR UPDATE`` on every row of the old epoch) waits for writes in
    flight, and every write after it sees the change: a stalled leader that wakes
    writes nothing (PostgreSQL; a SQLite file has one master). A transaction left
    idle by a stopped process ends after :data:`FENCE_IDLE_MS`; one stopped in the
    middle of a statement (a COPY waiting for rows from a frozen process is not idle)
    is ended by the takeover itself. Either way it cannot hold the takeover back.
    """
    if conn.dialect.name == "postgresql":
        # The transaction is named after its epoch, then locks the row: a takeover that
        # finds it holding the row past the lease's expiry ends it
        # (:meth:`Leases.end_writers`). One statement, one round trip: every commit of
        # a master's writer and every dispatch it logs begins so.
        found = conn.execute(
            _NAMED_AND_HELD,
            {"idle": str(FENCE_IDLE_MS), "name": writer_name(epoch), "epoch": epoch,
             "counter": COUNTER},
        ).one()[2]  # fmt: skip
    else:
        found = conn.scalar(
            select(MasterLease.epoch)
            .where(MasterLease.epoch == epoch, MasterLease.name != COUNTER)
            .limit(1)
            .with_for_update(read=True)
        )
    if found is None:
        newest = conn.scalar(select(func.max(MasterLease.epoch)))
        raise Fenced(f"another master took over (epoch {newest}): epoch {epoch} writes nothing")
    conn.info[CHECKED] = epoch  # the rest of this transaction need not prove it again


class Leases:
    """The leases of the scopes masters lead (one row each), and the cluster id."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)
        self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")

    def take(
        self,
        holder: str,
        wanted: Sequence[str],
        kept: Sequence[str] = (),
        epoch: int = 0,
        force: bool = False,
        ttl: float = LEASE_SECONDS,
    ) -> tuple[int, list[str], dict[str, tuple[str, float]]]:
        """Take the free scopes of ``wanted`` in one transaction: (the new epoch, the
        scopes taken, holder and seconds left of each scope found held).

        A scope is free when vacant, expired, held by ``holder`` itself, or held by a
        process of this host that is gone (killed); ``force`` takes live ones too. A
        family's scope is not free while another holder's :data:`WHOLE` lease lives,
        and :data:`WHOLE` not while another holder's family lease does. When anything
        is taken, a new epoch is drawn and stamped on the taken scopes and on ``kept``
        (the scopes ``holder`` leads at ``epoch``: :class:`Fenced` if one was taken
        from it); every other scope of a master a scope was taken from is vacated and
        re-stamped, so that master's writes are refused (:func:`check_fence`). With
        nothing free: ``(epoch, [], held)``, and nothing changes.
        """
        for attempt in range(2):
            try:
                return self._take(holder, wanted, kept, epoch, force, ttl)
            except OperationalError:  # a leader's write holds a row: not free now
                # Unless that leader's lease is over: then its write is ended, as a
                # stopped process's would be, and the take tried once more.
                if attempt or not self.end_writers(holder, wanted, force):
                    break
            except IntegrityError:  # another master added the same row meanwhile: next time
                return epoch, [], {"": ("another master", TAKE_LOCK_MS / 1000)}
        return epoch, [], {"": ("a writing master", TAKE_LOCK_MS / 1000)}

    def end_writers(self, holder: str, wanted: Sequence[str], force: bool = False) -> int:
        """End the write transactions of the masters whose leases on ``wanted`` are over
        (expired, their process gone, or any other holder's with ``force``): a master
        stopped in the middle of a write holds the lease row it shares for as long as it
        is stopped. Its write is rolled back, so it is fenced all the same. How many
        were ended (PostgreSQL; 0 elsewhere, or when not allowed to)."""
        if self.engine.dialect.name != "postgresql":
            return 0
        now = utcnow()
        with self.engine.connect() as conn:  # a plain read waits for no row lock
            rows = conn.execute(
                select(MasterLease.holder, MasterLease.epoch, MasterLease.expires_at).where(
                    MasterLease.name.in_(list(wanted)), MasterLease.holder != VACANT
                )
            ).all()
            over = {
                writer_name(epoch)
                for who, epoch, expires in rows
                if who != holder and (force or expires <= now or holder_gone(who))
            }
            if not over:
                return 0
            try:
                # Only this role's sessions on this database: the right any role has
                # over its own sessions, and no other application's, whatever its name.
                ended = conn.scalar(
                    text(
                        "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))"
                        " FROM pg_stat_activity WHERE application_name = ANY(:names)"
                        " AND usename = current_user AND datname = current_database()"
                        " AND pid <> pg_backend_pid()"
                    ),
                    {"names": sorted(over)},
                )
            except DBAPIError as exc:  # not allowed to: the lease waits for the write
                log.warning("could not end a stopped master's write: %s", exc)
                return 0
        if ended:
            log.warning("ended %d write(s) of a master whose lease is over", ended)
        return int(ended or 0)

    def _take(
        self,
        holder: str,
        wanted: Sequence[str],
        kept: Sequence[str],
        epoch: int,
        force: bool,
        ttl: float,
    ) -> tuple[int, list[str], dict[str, tuple[str, float]]]:
        with self.sessions() as s, s.begin():
            if self.engine.dialect.name == "postgresql":
                # A master stopped in the middle of its take holds every lease row: the
                # server ends the transaction once it sits idle (TAKE_IDLE_MS).
                s.execute(_TAKE_LIMITS, {"lock": str(TAKE_LOCK_MS), "idle": str(TAKE_IDLE_MS)})
            else:
                # SQLite has no FOR UPDATE, and its driver begins a transaction only at
                # the first write: write first (a no-op on the counter), so no other
                # write lands between the reads below and this transaction's writes.
                s.execute(
                    update(MasterLease)
                    .where(MasterLease.name == COUNTER)
                    .values(epoch=MasterLease.epoch)
                )
            counter = s.get(MasterLease, COUNTER, with_for_update=True)
            now = utcnow()
            if counter is None:
                last = s.scalar(select(func.max(MasterLease.epoch))) or 0
                counter = MasterLease(name=COUNTER, holder=VACANT, epoch=last, expires_at=now)
                s.add(counter)
            rows = {
                row.name: row
                for row in s.scalars(
                    select(MasterLease).where(MasterLease.name != COUNTER).with_for_update()
                )
            }

            def live_other(row: MasterLease | None) -> bool:
                return (
                    row is not None
                    and row.holder not in (VACANT, holder)
                    and row.expires_at > now
                    and not holder_gone(row.holder)
                )

            held: dict[str, tuple[str, float]] = {}
            free: list[str] = []
            for scope in wanted:
                row = rows.get(scope)
                if scope == WHOLE:
                    blocking = [r for r in rows.values() if live_other(r)]
                else:
                    blocking = [
                        r for r in (row, rows.get(WHOLE)) if r is not None and live_other(r)
                    ]
                if blocking and not force:
                    first = blocking[0]
                    held[scope] = (first.holder, (first.expires_at - now).total_seconds())
                else:
                    free.append(scope)
            if not free:
                return epoch, [], held
            for scope in kept:
                row = rows.get(scope)
                if row is None or row.epoch != epoch or row.holder != holder:
                    raise Fenced(f"{scope!r} was taken over: epoch {epoch} is old")
            counter.epoch += 1
            new = counter.epoch
            expires = now + dt.timedelta(seconds=ttl)
            # The masters whose scopes are taken lose all they lead (their epoch ends).
            ended = {
                rows[scope].epoch
                for scope in free
                if scope in rows and rows[scope].holder not in (VACANT, holder)
            }
            if WHOLE in free:  # everything: every family's leader ends too
                ended |= {r.epoch for r in rows.values() if r.holder not in (VACANT, holder)}
            for row in rows.values():
                if row.epoch in ended and row.name not in free:
                    row.holder, row.epoch, row.expires_at = VACANT, new, now
            for scope in (*free, *kept):
                row = rows.get(scope)
                if row is None:
                    s.add(MasterLease(name=scope, holder=holder, epoch=new, expires_at=expires))
                else:
                    row.holder, row.epoch, row.expires_at = holder, new, expires
            s.flush()
            return new, free, held

    def acquire(
        self,
        holder: str,
        name: str = WHOLE,
        force: bool = False,
        ttl: float = LEASE_SECONDS,
    ) -> int:
        """Take one scope (by default :data:`WHOLE`) and return the new epoch, or
        :class:`LeaseHeld` when another master's lease on it lives (see :meth:`take`)."""
        epoch, taken, held = self.take(holder, [name], force=force, ttl=ttl)
        if not taken:
            who, left = next(iter(held.values()))
            raise LeaseHeld(who, left)
        return epoch

    def holder(self, name: str | None = None) -> str | None:
        """Who holds a live lease on ``name`` (None: on any scope); None: nobody."""
        with self.sessions() as s:
            query = select(MasterLease).where(
                MasterLease.name != COUNTER,
                MasterLease.holder != VACANT,
                MasterLease.expires_at > utcnow(),
            )
            if name is not None:
                query = query.where(MasterLease.name == name)
            for lease in s.scalars(query.order_by(MasterLease.name)):
                if not holder_gone(lease.holder):
                    return lease.holder
            return None

    def renew(
        self, epoch: int, names: str | Sequence[str] = WHOLE, ttl: float = LEASE_SECONDS
    ) -> bool:
        """Extend the leases of ``epoch`` on ``names``; False when another master has
        taken one of them (we are fenced)."""
        scopes = [names] if isinstance(names, str) else list(names)
        # Committed as it runs: a leader stopped right after it (the renewer thread
        # waiting for the interpreter, the process frozen) leaves no transaction open
        # on its lease rows, which a standby's take would wait for until it is thawed.
        with self._autocommit.connect() as conn:
            res = conn.execute(
                update(MasterLease)
                .where(
                    MasterLease.name.in_(scopes),
                    MasterLease.epoch == epoch,
                    MasterLease.holder != VACANT,
                )
                .values(expires_at=utcnow() + dt.timedelta(seconds=ttl))
            )
            failpoint.hit("lease_renewed")
            return res.rowcount == len(scopes)

    def leases(self) -> list[tuple[str, str, int, dt.datetime]]:
        """Every lease row: (scope, holder, epoch, expires_at), by scope (for status)."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(
                    MasterLease.name, MasterLease.holder, MasterLease.epoch, MasterLease.expires_at
                )
                .where(MasterLease.name != COUNTER)
                .order_by(MasterLease.name)
            ).all()
        return [(r[0], r[1], r[2], r[3]) for r in rows]

    def release(self, epoch: int, names: str | Sequence[str] = WHOLE) -> None:
        """Give up the leases of ``epoch`` on ``names`` now (a clean stop, or a family
        handed to another master): the next master need not wait for them to expire."""
        scopes = [names] if isinstance(names, str) else list(names)
        with self._autocommit.connect() as conn:  # as a renewal: no transaction left open
            conn.execute(
                update(MasterLease)
                .where(MasterLease.name.in_(scopes), MasterLease.epoch == epoch)
                .values(holder=VACANT, expires_at=utcnow())
            )

    def newest_epoch(self) -> int:
        """The newest epoch this database ever issued (every take draws the next one)."""
        with self.engine.connect() as conn:
            return int(conn.scalar(select(func.max(MasterLease.epoch))) or 0)

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
