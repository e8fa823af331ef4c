"""What any process reports of the whole system, read from the database at each scrape."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ..log.store import Store
from .queue import Queue


class DatabaseCollector(Collector):
    """Nodes by state, on-demand queue jobs by family and state, overdue jobs, runs running.

    Read from the database at each scrape, so any process answers for the whole system.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[GaugeMetricFamily]:
        store = self.store
        nodes = GaugeMetricFamily("jodl_nodes", "Agent nodes, by state", labels=["state"])
        for state, n in Tally(str(n.state) for n in store.nodes(include_removed=True)).items():
            nodes.add_metric([state], n)
        jobs = GaugeMetricFamily(
            "jodl_queue_jobs",
            "On-demand queue jobs, by family and state",
            labels=["family", "state"],
        )
        overdue = GaugeMetricFamily(
            "jodl_queue_overdue_jobs",
            "On-demand jobs past their due time, by family",
            labels=["family"],
        )
        for family, c in Queue(store).counts().items():
            for state in ("queued", "running", "dead"):
                jobs.add_metric([family, state], c.get(state, 0))
            overdue.add_metric([family], c.get("overdue", 0))
        running = GaugeMetricFamily("jodl_runs_running", "Cycles running now")
        running.add_metric([], store.running_runs())
        yield from (nodes, jobs, overdue, running)


def register_database(store: Store, registry: CollectorRegistry = REGISTRY) -> DatabaseCollector:
    collector = DatabaseCollector(store)
    registry.register(collector)
    return collector


__all__ = ["DatabaseCollector", "register_database"]
