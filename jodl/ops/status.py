"""What ``jodl status`` and the web API show: nodes, families with job counts, recent runs."""

from __future__ import annotations

from typing import Any

from ..log.lease import FAMILY, WHOLE
from ..log.store import Store


def collect(store: Store, runs: int = 10) -> dict[str, Any]:
    out = store.reads.overview(runs)
    from ..queue import Queue  # the queue module imports the master: only when asked

    out["queue"] = Queue(store).counts()
    out["masters"] = masters(store)
    return out


def masters(store: Store) -> list[dict[str, Any]]:
    """Every registered master: name, role (leader/standby, or gone when its heartbeat
    expired), the scopes it leads with their epochs, the families it leads (``"*"``:
    every one), its epoch, when its heartbeat ends, and its ops endpoint (or None).

    What a master leads is read from the lease rows, not from its heartbeat: a leader
    stopped past its lease and taken over still says it leads until it notices, while
    a scope's row names one holder only, so no family ever shows two leaders."""
    held: dict[str, dict[str, int]] = {}
    for scope, holder, epoch, _ in store.leases():
        held.setdefault(holder, {})[scope] = epoch
    out = []
    for m in store.masters.masters():
        scopes: dict[str, int | None] = dict(held.get(m.name, {}))
        families = sorted(s[len(FAMILY) :] for s in scopes if s.startswith(FAMILY))
        role = "gone" if not m.live else ("leader" if scopes else "standby")
        out.append(
            {
                "name": m.name,
                "role": role,
                "scopes": scopes,
                "families": ["*"] if WHOLE in scopes else families,
                "epoch": max((e for e in scopes.values() if e is not None), default=None),
                "started_at": m.started_at,
                "expires_at": m.expires_at,
                "ops": m.ops or None,
            }
        )
    return out
