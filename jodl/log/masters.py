"""Live masters: each master process's heartbeat, role and the scopes it leads."""

from __future__ import annotations

import datetime as dt
from typing import NamedTuple

from sqlalchemy import Engine, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from .models import MasterNode, utcnow


class MasterRow(NamedTuple):
    """One registered master as ``jodl status`` and the API show it."""

    name: str
    role: str
    scopes: tuple[str, ...]
    started_at: dt.datetime
    expires_at: dt.datetime
    live: bool


class MasterRegistry:
    """The ``jodl_master_node`` rows: one per master process, renewed by its heartbeat."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def heartbeat(self, name: str, ttl: float, role: str, scopes: tuple[str, ...]) -> None:
        """Say ``name`` lives for ``ttl`` more seconds, in ``role``, leading ``scopes``."""
        values = {
            "role": role,
            "scopes": " ".join(scopes),
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
        return [
            MasterRow(
                r.name,
                r.role,
                tuple(r.scopes.split()) if r.scopes else (),
                r.started_at,
                r.expires_at,
                r.expires_at > now,
            )
            for r in rows
        ]
