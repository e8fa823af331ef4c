"""Counters of the web process and its ``/metrics`` page (prometheus_client).

Counters (requests, submissions, cache hits, streamed events, ...) live in the
process; gauges (nodes, queue, runs) are read from the database at each scrape
by :class:`jodl.ops.metrics.DatabaseCollector`, so any web process answers for the
whole system.

``jodl web`` is waitress: one process, a pool of threads, so one registry per
app is exact (prometheus_client's metrics are thread-safe). A deployment that
runs the app under several worker processes (e.g. gunicorn) must set
``PROMETHEUS_MULTIPROC_DIR``; the page then sums every worker's counters with
prometheus_client's multiprocess collector.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, multiprocess
from sqlalchemy import Engine

from jodl.log import Store
from jodl.ops.metrics import DatabaseCollector

#: Counters this process keeps: help text and label names (names without ``_total``).
COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "jodl_web_requests": ("HTTP requests answered, by status class", ("code",)),
    "jodl_web_batches": ("Batches of URLs submitted", ()),
    "jodl_web_urls": ("URLs submitted, by how they were answered", ("answer",)),
    "jodl_web_events": ("Result events sent on event streams", ()),
    "jodl_web_rate_limited": ("Requests refused by the rate limit", ()),
    "jodl_web_cache_resets": ("URLs whose cached results were forgotten", ()),
    "jodl_web_quota_refused": ("Requests refused by a user quota, by quota", ("quota",)),
}
GAUGES = {
    "jodl_web_streams_open": "Event streams open now in this process",
}


class Metrics:
    """The web process's counters and gauges, in a registry of their own (one per app)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._metrics: dict[str, Any] = {}
        for name, (text, labels) in COUNTERS.items():
            self._metrics[name + "_total"] = Counter(name, text, labels, registry=self.registry)
        for name, text in GAUGES.items():
            # livesum: with several worker processes, the streams open in all of them
            self._metrics[name] = Gauge(
                name, text, registry=self.registry, multiprocess_mode="livesum"
            )

    def _metric(self, name: str, labels: dict[str, str]) -> Any:
        metric = self._metrics[name]
        return metric.labels(**labels) if labels else metric

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        if amount:
            self._metric(name, labels).inc(amount)

    def add(self, name: str, amount: float) -> None:
        """Move a gauge by ``amount`` (e.g. +1 when a stream opens, -1 when it closes)."""
        self._metrics[name].inc(amount)

    def value(self, name: str, **labels: str) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0

    def render(self, engine: Engine | None = None) -> str:
        """The exposition text: this process's metrics, then the system's gauges."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)
            text = generate_latest(registry).decode()
        else:
            text = generate_latest(self.registry).decode()
        if engine is not None:
            system = CollectorRegistry()
            system.register(DatabaseCollector(Store(engine)))
            text += generate_latest(system).decode()
        return text


__all__ = ["Metrics"]
