"""Counters of the web process and the ``/metrics`` page in Prometheus' text format.

Counters (requests, submissions, cache hits, streamed events, ...) live in the
process; gauges (nodes, queue, runs) are read from the database at each scrape,
so any web process answers for the whole system.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Engine, func, select

from jodl.models import Family, Job, Node, Run, RunState
from jodl.queue import QUEUE_STATES

#: Help text of each counter this process keeps.
COUNTERS = {
    "jodl_web_requests_total": "HTTP requests answered, by status class",
    "jodl_web_batches_total": "Batches of URLs submitted",
    "jodl_web_urls_total": "URLs submitted, by how they were answered",
    "jodl_web_events_total": "Result events sent on event streams",
    "jodl_web_rate_limited_total": "Requests refused by the rate limit",
    "jodl_web_cache_resets_total": "URLs whose cached results were forgotten",
}
GAUGES = {
    "jodl_web_streams_open": "Event streams open now in this process",
}


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(labels.items())) + "}"


class Metrics:
    """Thread-safe counters and gauges of one web process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def add(self, name: str, amount: float) -> None:
        """Move a gauge by ``amount`` (e.g. +1 when a stream opens, -1 when it closes)."""
        self.inc(name, amount)

    def value(self, name: str, **labels: str) -> float:
        with self._lock:
            return self._values.get((name, tuple(sorted(labels.items()))), 0.0)

    def render(self, engine: Engine | None = None) -> str:
        """The exposition text: this process's counters, then the system's gauges."""
        lines: list[str] = []
        with self._lock:
            values = dict(self._values)
        for name, text in {**COUNTERS, **GAUGES}.items():
            kind = "counter" if name in COUNTERS else "gauge"
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
            rows = [(dict(k[1]), v) for k, v in values.items() if k[0] == name]
            if not rows and kind == "gauge":
                rows = [({}, 0.0)]
            for labels, value in rows:
                lines.append(f"{name}{_labels(labels)} {value:g}")
        if engine is not None:
            lines += system_gauges(engine)
        return "\n".join(lines) + "\n"


def _gauge(name: str, text: str, rows: Iterable[tuple[dict[str, str], Any]]) -> list[str]:
    out = [f"# HELP {name} {text}", f"# TYPE {name} gauge"]
    out += [f"{name}{_labels(labels)} {float(value or 0):g}" for labels, value in rows]
    return out


def system_gauges(engine: Engine) -> list[str]:
    """Nodes by state, queue jobs by family and state, running runs (from the database)."""
    with engine.connect() as conn:
        nodes = conn.execute(select(Node.state, func.count()).group_by(Node.state)).all()
        jobs = conn.execute(
            select(Family.name, Job.state, func.count())
            .join(Family, Family.id == Job.family_id)
            .where(Job.state.in_(QUEUE_STATES))
            .group_by(Family.name, Job.state)
        ).all()
        running = conn.scalar(
            select(func.count()).select_from(Run).where(Run.state == RunState.RUNNING)
        )
    out = _gauge("jodl_nodes", "Agent nodes, by state", [({"state": s}, n) for s, n in nodes])
    out += _gauge(
        "jodl_queue_jobs",
        "On-demand queue jobs, by family and state",
        [({"family": f, "state": s}, n) for f, s, n in jobs],
    )
    out += _gauge("jodl_runs_running", "Cycles running now", [({}, running)])
    return out
