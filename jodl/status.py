"""What ``jodl status`` and the web API show: nodes, families with job counts, recent runs."""

from __future__ import annotations

from typing import Any

from .log.store import Store


def collect(store: Store, runs: int = 10) -> dict[str, Any]:
    out = store.reads.overview(runs)
    from .queue import Queue  # the queue module imports the master: only when asked

    out["queue"] = Queue(store).counts()
    out["masters"] = masters(store)
    return out


def masters(store: Store) -> list[dict[str, Any]]:
    """Every registered master: name, role (leader/standby, or gone when its heartbeat
    expired), the scopes it leads with their epochs, and when its heartbeat ends."""
    epochs = {(holder, scope): epoch for scope, holder, epoch, _ in store.leases.leases()}
    return [
        {
            "name": m.name,
            "role": m.role if m.live else "gone",
            "scopes": {scope: epochs.get((m.name, scope)) for scope in m.scopes},
            "started_at": m.started_at,
            "expires_at": m.expires_at,
        }
        for m in store.masters.masters()
    ]
