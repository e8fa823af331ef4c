"""What ``jodl status`` and the web API show: nodes, families with job counts, recent runs."""

from __future__ import annotations

from typing import Any

from .log.lease import FAMILY, WHOLE
from .log.store import Store


def collect(store: Store, runs: int = 10) -> dict[str, Any]:
    out = store.reads.overview(runs)
    from .queue import Queue  # the queue module imports the master: only when asked

    out["queue"] = Queue(store).counts()
    out["masters"] = masters(store)
    return out


def masters(store: Store) -> list[dict[str, Any]]:
    """Every registered master: name, role (leader/standby, or gone when its heartbeat
    expired), the scopes it leads with their epochs, the families it leads (``"*"``:
    every one), its epoch, and when its heartbeat ends."""
    epochs = {(holder, scope): epoch for scope, holder, epoch, _ in store.leases.leases()}
    out = []
    for m in store.masters.masters():
        scopes = {scope: epochs.get((m.name, scope)) for scope in m.scopes}
        families = sorted(s[len(FAMILY) :] for s in scopes if s.startswith(FAMILY))
        out.append(
            {
                "name": m.name,
                "role": m.role if m.live else "gone",
                "scopes": scopes,
                "families": ["*"] if WHOLE in scopes else families,
                "epoch": max((e for e in scopes.values() if e is not None), default=None),
                "started_at": m.started_at,
                "expires_at": m.expires_at,
            }
        )
    return out
