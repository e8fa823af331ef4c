"""An agent's jobs by state, read at each scrape of its ``/metrics``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector


class AgentCollector(Collector):
    """An agent's jobs by state (queued, running, results held), read at each scrape."""

    def __init__(self, core: Any) -> None:
        self.core = core

    def collect(self) -> Iterator[GaugeMetricFamily]:
        queued, running, done, failed = self.core.remaining()
        jobs = GaugeMetricFamily(
            "jodl_agent_jobs", "Jobs on this agent, by state", labels=["state"]
        )
        for state, n in (("queued", queued), ("running", running), ("held", done + failed)):
            jobs.add_metric([state], n)
        slots = GaugeMetricFamily("jodl_agent_slots", "Job slots (threads) of this agent")
        slots.add_metric([], self.core.slots)
        yield from (jobs, slots)


def register_agent(core: Any, registry: CollectorRegistry = REGISTRY) -> AgentCollector:
    collector = AgentCollector(core)
    registry.register(collector)
    return collector


__all__ = ["AgentCollector", "register_agent"]
