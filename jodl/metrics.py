"""The Prometheus metrics of the master, the agents and the applications (prometheus_client).

Every metric of the system is declared here, once, on prometheus_client's default
registry; ``docs/grafana-dashboard.json`` queries exactly these names (a test
scrapes live processes for them). What costs the master's loop nothing extra is
read when it is cheap:

* counters move once per batch (a send, one agent's results), never per job call;
* gauges about nodes, runs and the log writer are set by :class:`MasterGauges`
  at most once per second from state the master keeps anyway;
* the on-demand queue and the node table are read from the database only when
  someone scrapes (:class:`DatabaseCollector`).
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Iterable, Iterator
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# The *_created samples (when each labelled series first appeared) only add lines here.
disable_created_metrics()

if TYPE_CHECKING:
    from .log.store import Store
    from .master import Master

# -- master: jobs ---------------------------------------------------------------------------

JOBS_DISPATCHED = Counter(
    "jodl_jobs_dispatched", "Job executions sent to agents, by family", ["family"]
)
JOBS_DONE = Counter(
    "jodl_jobs_done", "Job executions done (result committed), by family", ["family"]
)
JOBS_FAILED = Counter("jodl_jobs_failed", "Failed job attempts, by family", ["family"])
JOBS_RETRIED = Counter(
    "jodl_jobs_retried", "Failed jobs given another attempt, by family", ["family"]
)
JOBS_DEAD = Counter(
    "jodl_jobs_dead", "Jobs declared dead (no attempts left), by family", ["family"]
)

# -- budgets (jodl/budget.py) ---------------------------------------------------------------

BUDGET_EXHAUSTED = Counter(
    "jodl_budget_exhausted",
    "Times a family budget held work back (a cycle cut short, an hour's claims used up)",
    ["family", "budget"],
)
JOBS_DEFERRED = Counter(
    "jodl_jobs_deferred",
    "Due jobs a family budget put off to the next cycle, by family and budget",
    ["family", "budget"],
)

#: Loop steps take from ~100 µs (nothing to do) to seconds (a large commit on a slow disk).
LOOP_STEP = Histogram(
    "jodl_master_loop_step_seconds",
    "Time of one pass of the master's loop, its pauses excluded",
    buckets=(0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)

# -- master: nodes (set once per second) ------------------------------------------------------

NODE_ROUND_TRIP = Gauge(
    "jodl_node_round_trip_seconds", "Moving mean of one call to the node's agent", ["node"]
)
NODE_SLOTS_BUSY = Gauge(
    "jodl_node_slots_busy", "Job slots of the node running or queued jobs now", ["node"]
)
NODE_SLOTS = Gauge("jodl_node_slots", "Job slots of the node", ["node"])
NODE_IN_FLIGHT = Gauge(
    "jodl_node_jobs_in_flight", "Jobs sent to the node, no outcome yet", ["node"]
)
NODE_SPEED = Gauge("jodl_node_speed", "Learned speed of the node (1 = reference)", ["node"])
NODE_UP = Gauge("jodl_node_up", "1 while the master is connected to the node's agent", ["node"])

# -- master: runs and the reconstruction log ---------------------------------------------------

RUN_JOBS_TOTAL = Gauge("jodl_run_jobs_total", "Jobs of the running cycle, by family", ["family"])
RUN_JOBS_DONE = Gauge("jodl_run_jobs_done", "Jobs of the running cycle done, by family", ["family"])
WRITER_QUEUE = Gauge("jodl_log_writer_queue_depth", "Outcome batches waiting for the log writer")
WRITER_COMMIT = Histogram(
    "jodl_log_writer_commit_seconds",
    "Time to commit one batch of outcomes to the reconstruction log",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)

# -- agents -------------------------------------------------------------------------------------

AGENT_JOBS_FINISHED = Counter(
    "jodl_agent_jobs_finished", "Jobs this agent finished, by outcome (done, failed)", ["outcome"]
)


def count_sent(wires: Iterable[list[tuple[int, str, str]]]) -> None:
    """Count one send step: ``wires`` are the (exec_id, family, payload) batches."""
    tally: Tally[str] = Tally()
    for wire in wires:
        tally.update(map(itemgetter(1), wire))
    for family, n in tally.items():
        JOBS_DISPATCHED.labels(family).inc(n)


def count_outcomes(
    finished: list[Any], n_done: int, dead: list[Any], retry: list[int], claims: list[Any],
    pending: dict[int, Any],
) -> None:  # fmt: skip
    """Count one agent's collected outcomes (the master's ``_outcomes`` lists).

    ``finished[:n_done]`` are the jobs done; a failed attempt either got another
    one (``retry``, or an on-demand claim with a due time) or made its job dead
    (``dead``, or a claim without one).
    """
    if n_done:
        for family, n in Tally(job.family for job in finished[:n_done]).items():
            JOBS_DONE.labels(family).inc(n)
    if len(finished) == n_done and not retry and not dead:
        return
    families = {job.id: job.family for job in finished[n_done:]}
    retried: Tally[str] = Tally(pending[j].family for j in retry if j in pending)
    lost: Tally[str] = Tally(families.get(d[0], "?") for d in dead)
    for claim in claims:
        if len(claim) == 4 and claim[0] in families:  # an on-demand job's failure
            (lost if claim[3] is None else retried)[families[claim[0]]] += 1
    for family, n in retried.items():
        JOBS_RETRIED.labels(family).inc(n)
        JOBS_FAILED.labels(family).inc(n)
    for family, n in lost.items():
        JOBS_DEAD.labels(family).inc(n)
        JOBS_FAILED.labels(family).inc(n)


class MasterGauges:
    """Sets the master's gauges, and writes runs' progress, at most once per :data:`PERIOD`."""

    #: Seconds between two updates: often enough for a dashboard or ``status --watch``,
    #: rarely enough that the loop never notices (one small UPDATE per running run).
    PERIOD = 1.0

    def __init__(self) -> None:
        self.next_at = 0.0
        self._written: dict[int, tuple[int, int, int]] = {}

    def maybe_update(self, master: Master) -> None:
        now = time.monotonic()
        if now < self.next_at:
            return
        self.next_at = now + self.PERIOD
        self.update(master)

    def update(self, master: Master) -> None:
        for slot in master.nodes.values():
            node = slot.link.address
            NODE_UP.labels(node).set(1 if slot.usable else 0)
            NODE_SLOTS.labels(node).set(slot.load.slots)
            in_flight = len(master.book.flights.get(slot.id, ()))
            NODE_IN_FLIGHT.labels(node).set(in_flight)
            NODE_SLOTS_BUSY.labels(node).set(min(slot.load.slots, in_flight))
            NODE_SPEED.labels(node).set(slot.load.speed)
            NODE_ROUND_TRIP.labels(node).set(slot.link.call_time)
        WRITER_QUEUE.set(master.writer.depth())
        for active in master.runs.values():
            family = active.family.name
            RUN_JOBS_TOTAL.labels(family).set(active.total)
            RUN_JOBS_DONE.labels(family).set(active.done)
            counts = (active.done, active.failed, active.dead)
            if self._written.get(active.run.id) != counts:
                master.store.run_progress(active.run.id, *counts)
                self._written[active.run.id] = counts
        for run_id in [r for r in self._written if r not in master.runs]:
            del self._written[run_id]

    def run_finished(self, active: Any) -> None:
        """A run closed: its gauges show its final counts."""
        RUN_JOBS_TOTAL.labels(active.family.name).set(active.total)
        RUN_JOBS_DONE.labels(active.family.name).set(active.done)
        self._written.pop(active.run.id, None)


class DatabaseCollector(Collector):
    """Nodes by state, on-demand queue jobs by family and state, overdue jobs, runs running.

    Read from the database at each scrape, so any process answers for the whole system.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from .queue import Queue  # the queue module imports the master: only when scraped

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


def register_database(store: Store, registry: CollectorRegistry = REGISTRY) -> DatabaseCollector:
    collector = DatabaseCollector(store)
    registry.register(collector)
    return collector


__all__ = [
    "DatabaseCollector",
    "AgentCollector",
    "MasterGauges",
    "count_outcomes",
    "count_sent",
    "register_agent",
    "register_database",
]
