"""Live masters: each master process's heartbeat, role and the scopes it leads."""

from __future__ import annotations

import datetime as dt
from typing import NamedTuple

from sqlalchemy import Engine, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from .models import MasterNode, utcnow

#: How the heartbeat row's ``scopes`` text names the master's ops endpoint among its
#: scopes (which begin ``family:`` or are ``master``): ``ops=HOST:PORT``. The address
#: rides in the row the master renews anyway, so finding it needs no column of its own.
OPS_PREFIX = "ops="


class MasterRow(NamedTuple):
    """One registered master as ``jodl status`` and the API show it."""

    name: str
    role: str
    scopes: tuple[str, ...]
    started_at: dt.datetime
    expires_at: dt.datetime
    live: bool
    #: Where its ops endpoint (health, /metrics) listens; "" when it serves none.
    ops: str = ""


class MasterRegistry:
    """The ``jodl_master_node`` rows: one per master process, renewed by its heartbeat."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def heartbeat(
        self, name: str, ttl: float, role: str, scopes: tuple[str, ...], ops: str = ""
    ) -> None:
        """Say ``name`` lives for ``ttl`` more seconds, in ``role``, leading ``scopes``,
        its ops endpoint at ``ops`` (HOST:PORT; "" when it serves none)."""
        words = [*scopes, OPS_PREFIX + ops] if ops else list(scopes)
        values = {
            "role": role,
            "scopes": " ".join(words),
            "expires_at": utcnow() + dt.timedelta(seconds=ttl),
        }
        with self.engine.begin() as conn:
            res = conn.execute(update(MasterNode).where(MasterNode.name == name).values(**values))
            if res.rowcount == 1:
                return
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(MasterNode).values(name=name, started_at=utcnow(), **values))
        except IntegrityError:  # inserted meanwhile by ourselves: nothing to do
            pass

    def live(self) -> list[str]:
        """Names of the masters whose heartbeat has not expired, sorted."""
        return sorted(self.live_for())

    def live_for(self) -> dict[str, float]:
        """The masters whose heartbeat has not expired: name -> seconds it has left."""
        now = utcnow()
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(MasterNode.name, MasterNode.expires_at).where(MasterNode.expires_at > now)
            ).all()
        return {name: (expires - now).total_seconds() for name, expires in rows}

    def leave(self, name: str) -> None:
        """Remove ``name`` (a clean stop): the others rebalance its scopes at once."""
        with self.engine.begin() as conn:
            conn.execute(delete(MasterNode).where(MasterNode.name == name))

    def masters(self) -> list[MasterRow]:
        """Every registered master (live or not), by name."""
        now = utcnow()
        with self.engine.connect() as conn:
            rows = conn.execute(select(MasterNode).order_by(MasterNode.name)).all()
        out = []
        for r in rows:
            words = r.scopes.split() if r.scopes else []
            ops = [w[len(OPS_PREFIX) :] for w in words if w.startswith(OPS_PREFIX)]
            scopes = tuple(w for w in words if not w.startswith(OPS_PREFIX))
            live = r.expires_at > now
            out.append(
                MasterRow(r.name, r.role, scopes, r.started_at, r.expires_at, live, *ops[:1])
            )
        return out
