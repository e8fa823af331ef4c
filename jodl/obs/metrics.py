"""Every Prometheus metric of the system, declared once (prometheus_client's registry).

This module imports nothing of JODL, so any layer may count with it;
``docs/grafana-dashboard.json`` queries exactly these names (a test scrapes live
processes for them). What reads state to report it lives beside that state: the
master's gauges in :mod:`jodl.master.gauges` (at most once per second, from state
the master keeps anyway), the agent's in :mod:`jodl.agent.collector`, the
database's (queue, nodes, runs: read only when someone scrapes) in
:mod:`jodl.log.collector`. Counters move once per batch, never per job call.
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterable
from operator import itemgetter
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

# The *_created samples (when each labelled series first appeared) only add lines here.
disable_created_metrics()

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

# -- budgets (jodl/admin/budget.py) ---------------------------------------------------------------

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

#: Loop steps take from ~100 µs (nothing to do) to seconds (a large commit on a slow disk,
#: a cycle's first placement); between 0.5 and 5 s finer, where "is every agent polled
#: once a second" is read (bench/farm.py).
LOOP_STEP = Histogram(
    "jodl_master_loop_step_seconds",
    "Time of one pass of the master's loop, its pauses excluded",
    buckets=(
        0.0001,
        0.0005,
        0.001,
        0.0025,
        0.005,
        0.01,
        0.025,
        0.05,
        0.1,
        0.25,
        0.5,
        0.75,
        1,
        1.5,
        2.5,
        5,
    ),
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
    "Time of one commit of outcomes to the reconstruction log (the batches queued meanwhile)",
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
        due = getattr(claim, "due_at", _DONE)  # only a failed claim has one
        if due is not _DONE and claim.job_id in families:  # an on-demand job's failure
            (lost if due is None else retried)[families[claim.job_id]] += 1
    for family, n in retried.items():
        JOBS_RETRIED.labels(family).inc(n)
        JOBS_FAILED.labels(family).inc(n)
    for family, n in lost.items():
        JOBS_DEAD.labels(family).inc(n)
        JOBS_FAILED.labels(family).inc(n)


_DONE = object()
