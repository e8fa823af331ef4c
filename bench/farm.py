"""Hundreds of agents: one master polls every agent of a farm while its jobs flow.

A *farm* is a few processes (``--processes``) serving ``--agents`` agents between
them, each agent the product's own (``jodl.agent.make_server``: its core, its rpyc
server on its own port, its own node key derived from the run's secret), so the
master sees as many nodes as a cluster of that many machines would give it. All
are registered as nodes of a fresh PostgreSQL database, ``--jobs`` no-op jobs are
added, and a master in its own process runs one cycle of them.

Each farm process notes, per agent, when the master sent it jobs and when it polled
it: asked for its state, which is the one call per agent per loop step that collects
results and failures (``exchange`` when it also sends jobs, ``outcomes`` when it does
not, ``done`` for acknowledgements only) and, to an agent with nothing in flight (its
share done, or waiting for the run's next jobs), the question whether it drains that
the master asks each such agent once a second (``draining``).
Reported:

* ``jobs_per_s``: jobs of the cycle ÷ its seconds;
* ``master_cpu_s`` and ``master_cpu_pct``: the master process's CPU time over the
  cycle (every thread), and that ÷ the cycle's seconds;
* ``step_p50_ms`` and ``step_p95_ms``: the master loop step's quantiles from its own
  histogram (``jodl_master_loop_step_seconds``, pauses excluded), interpolated in
  the bucket as Prometheus' ``histogram_quantile`` does; ``step_mean_ms`` exact;
* ``min_polls_per_s``: the slowest agent's polls per second while the jobs flow,
  from the cycle's first send to its last poll (``flow_s``; target at least 1), and
  ``max_poll_gap_s``: the longest any agent waited for the master's next call while
  it held jobs.

The last line printed is one JSON object with the figures.

    python bench/farm.py --agents 500 --processes 4 --jobs 100000
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import DEFAULT_PG, SECRET, fresh_database  # noqa: E402

#: The master process: one cycle, timed in wall and CPU seconds, then its loop step's
#: histogram (cumulative counts by upper bound) and the cycle's monotonic bounds.
MASTER = """
import json, sys, time
from jodl import Master, Settings, Store, make_engine
from jodl.obs.metrics import LOOP_STEP
url, jobs = sys.argv[1], int(sys.argv[2])
master = Master(Settings(database_url=url, log_level="WARNING", secret=sys.argv[3]),
                store=Store(make_engine(url)))
master.start()  # connecting the agents is not part of the cycle
started, cpu = time.monotonic(), time.process_time()
summary = master.run_cycle("noop")
ended, cpu = time.monotonic(), time.process_time() - cpu
if summary.done != jobs:
    raise SystemExit(f"expected {jobs} results, got {summary.done}")
buckets, total = [], 0.0
for sample in LOOP_STEP.collect()[0].samples:
    if sample.name.endswith("_bucket"):
        buckets.append((float(sample.labels["le"]), sample.value))
    elif sample.name.endswith("_sum"):
        total = sample.value
master.close()
print(json.dumps({"started": started, "ended": ended, "cpu": cpu,
                  "buckets": buckets, "step_sum": total}))
"""


def serve_farm(slots: int) -> None:
    """A farm process: the agents of ``[address, node key]`` pairs read from stdin, each
    served on its own port; says ``ready`` once all listen, and on the next line of
    stdin (or its end) when the master sent to and polled each agent as one JSON
    object (address -> [send times, poll times], monotonic seconds), both on stdout."""
    from jodl import Settings
    from jodl.agent import AgentService, make_server

    class CountedService(AgentService):
        """The agent's own service, noting when the master sends to it and polls it, and
        which of those calls left it holding nothing (no job queued or running, no
        result the master has not acknowledged)."""

        def __init__(self, core: Any) -> None:
            super().__init__(core)
            self.sends: list[float] = []
            self.polls: list[float] = []
            self.empty: list[float] = []

        # One thread per connection, and one connection from the master: no lock.
        def _noted(self, name: str, args: Any, kwargs: Any, *lists: list[float]) -> Any:
            now = time.monotonic()
            for noted in lists:
                noted.append(now)
            try:
                return getattr(AgentService, f"exposed_{name}")(self, *args, **kwargs)
            finally:
                if not any(self._core.remaining()):
                    self.empty.append(now)

        def exposed_send(self, *args: Any, **kwargs: Any) -> Any:
            return self._noted("send", args, kwargs, self.sends)

        def exposed_done(self, *args: Any, **kwargs: Any) -> Any:
            return self._noted("done", args, kwargs, self.polls)

        def exposed_outcomes(self, *args: Any, **kwargs: Any) -> Any:
            return self._noted("outcomes", args, kwargs, self.polls)

        def exposed_draining(self, *args: Any, **kwargs: Any) -> Any:
            return self._noted("draining", args, kwargs, self.polls)

        def exposed_exchange(self, *args: Any, **kwargs: Any) -> Any:
            # a send, and a poll: it answers the outcomes too
            return self._noted("exchange", args, kwargs, self.sends, self.polls)

    counted: dict[str, CountedService] = {}
    servers = []
    for address, key in json.loads(sys.stdin.readline()):
        settings = Settings(node_key=key, agent_slots=slots, log_level="WARNING")
        server = make_server(settings, listen=address, name=address)
        # The server hands this instance to every connection it authenticates.
        server.service = counted[address] = CountedService(server.core)
        threading.Thread(target=server.start, daemon=True).start()
        servers.append(server)
    while not all(server.active for server in servers):
        time.sleep(0.01)
    print("ready", flush=True)
    sys.stdin.readline()
    calls = {address: [s.sends, s.polls, s.empty] for address, s in counted.items()}
    print(json.dumps(calls))
    sys.stdout.flush()
    for server in servers:
        server.close()
        server.core.close()


def loopback_addresses(count: int) -> list[str]:
    """``count`` distinct free loopback addresses (all bound at once, then let go)."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [f"127.0.0.1:{sock.getsockname()[1]}" for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """The ``q`` quantile of a cumulative histogram, interpolated linearly within its
    bucket (Prometheus' ``histogram_quantile``); the top finite bound past the last."""
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-9)
        lower, below = bound, count
    return lower


def poll_figures(
    calls: dict[str, list[list[float]]], started: float, ended: float
) -> dict[str, Any]:
    """Polls while the jobs flow: from the cycle's first send to its last poll.

    Each agent's polls in that window per second of it (the slowest agent's, the
    median); and the longest any agent waited for a call of the master (send or poll)
    while it held jobs: from a call that left it holding some (queued, running, or
    results not acknowledged) to the next call. An agent holding nothing (its share
    done, waiting for the run's next jobs) is asked once a second whether it drains,
    and those waits do not count.
    """
    sends = [t for s, _p, _e in calls.values() for t in s if started <= t <= ended]
    polls = [t for _s, p, _e in calls.values() for t in p if started <= t <= ended]
    first, last = min(sends), max(polls)
    rates, gaps = [], []
    for agent_sends, agent_polls, agent_empty in calls.values():
        within = [t for t in agent_polls if first <= t <= last]
        rates.append(len(within) / (last - first))
        sent = [t for t in agent_sends if first <= t <= last]
        if sent and within:
            empty = set(agent_empty)
            held = sorted(set(sent + within))
            gaps.append(
                max(
                    (b - a for a, b in zip(held, held[1:], strict=False) if a not in empty),
                    default=0.0,
                )
            )
    rates.sort()
    return {
        "flow_s": round(last - first, 2),
        "min_polls_per_s": round(rates[0], 2),
        "median_polls_per_s": round(rates[len(rates) // 2], 2),
        "max_poll_gap_s": round(max(gaps, default=0.0), 3),
        "unpolled_agents": sum(1 for r in rates if r == 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=500)
    parser.add_argument("--processes", type=int, default=4, help="farm processes")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--slots", type=int, default=1, help="slots per agent")
    parser.add_argument("--db-url", default=DEFAULT_PG, help="PostgreSQL server (fresh database)")
    parser.add_argument("--serve-farm", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_farm:
        serve_farm(args.slots)
        return

    from jodl import Store, make_engine
    from jodl.agent import node_key
    from jodl.log.migrate import upgrade

    began = time.perf_counter()
    addresses = loopback_addresses(args.agents)
    farms: list[subprocess.Popen[str]] = []
    with fresh_database(args.db_url) as db_url:
        engine = make_engine(db_url)
        upgrade(engine)
        store = Store(engine)
        for address in addresses:
            store.add_node(address, slots=args.slots)
        family = store.ensure_family("noop")
        store.add_jobs(family, ((f"job-{i}", "{}") for i in range(args.jobs)))
        engine.dispose()
        try:
            for share in range(args.processes):
                mine = addresses[share :: args.processes]
                farm = subprocess.Popen(
                    [sys.executable, __file__, "--serve-farm", "--slots", str(args.slots)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                    env={**os.environ, "JODL_LOG_LEVEL": "WARNING"},
                )
                assert farm.stdin is not None
                farm.stdin.write(json.dumps([[a, node_key(SECRET, a)] for a in mine]) + "\n")
                farm.stdin.flush()
                farms.append(farm)
            for farm in farms:
                assert farm.stdout is not None
                if farm.stdout.readline().strip() != "ready":
                    raise SystemExit("a farm process did not start its agents (see above)")
            print(f"{args.agents} agents in {args.processes} processes listen", flush=True)
            done = subprocess.run(
                [sys.executable, "-c", MASTER, db_url, str(args.jobs), SECRET],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                raise SystemExit(f"the master failed:\n{done.stderr[-3000:]}")
            ran = json.loads(done.stdout.strip().splitlines()[-1])
            calls: dict[str, list[list[float]]] = {}
            for farm in farms:
                out, _ = farm.communicate("stop\n", timeout=60)
                calls.update(json.loads(out.strip().splitlines()[-1]))
        finally:
            for farm in farms:
                if farm.poll() is None:
                    farm.kill()
                    farm.wait()
    seconds = ran["ended"] - ran["started"]
    steps = ran["buckets"][-1][1]
    out = {
        "agents": args.agents,
        "processes": args.processes,
        "jobs": args.jobs,
        "jobs_per_s": round(args.jobs / seconds),
        "cycle_s": round(seconds, 2),
        "master_cpu_s": round(ran["cpu"], 2),
        "master_cpu_pct": round(100 * ran["cpu"] / seconds, 1),
        "steps": int(steps),
        "step_p50_ms": round(1000 * quantile(0.5, ran["buckets"]), 2),
        "step_p95_ms": round(1000 * quantile(0.95, ran["buckets"]), 2),
        "step_mean_ms": round(1000 * ran["step_sum"] / max(steps, 1), 2),
        **poll_figures(calls, ran["started"], ran["ended"]),
        "seconds": round(time.perf_counter() - began, 1),
    }
    print(
        f"{args.jobs} jobs on {args.agents} agents: {out['jobs_per_s']} jobs/s, master CPU "
        f"{out['master_cpu_s']} s ({out['master_cpu_pct']} %), step p50/p95 "
        f"{out['step_p50_ms']}/{out['step_p95_ms']} ms, slowest agent polled "
        f"{out['min_polls_per_s']}/s",
        flush=True,
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
