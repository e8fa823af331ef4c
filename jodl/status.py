"""What ``jodl status`` and the web API show: nodes, families with job counts, recent runs."""

from __future__ import annotations

from typing import Any

from .log.store import Store


def collect(store: Store, runs: int = 10) -> dict[str, Any]:
    out = store.reads.overview(runs)
    from .queue import Queue  # the queue module imports the master: only when asked

    out["queue"] = Queue(store).counts()
    return out
