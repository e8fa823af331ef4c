"""Makespan against the lower bound: the default placement, round robin and a pull queue.

Four agents of speeds 1:1:2:4 (one slot each, ``jodl agent --speed``) run 400
``sleep`` jobs whose work is drawn from a heavy-tailed lognormal distribution and
scaled so that the lower bound of one cycle is ``--lb`` seconds; five cycles, for
several random seeds. For each cycle it prints makespan ÷ LB, where

    LB = max(total work ÷ total speed, longest job ÷ fastest node)

with each job's work taken as the duration the agent measured for it times the
speed factor of that agent. Measured, not drawn: an agent's ``time.sleep`` runs
over by a fraction of a millisecond per job (more on a loaded machine), which
is work no placement can avoid; every peer's LB is computed the same way from
its own cycle. The ratio against the drawn work (``nominal``) and, for the JODL
peers, against the master's own learned LB (what ``jodl status`` shows) are
printed too.

Peers, all on the same agent processes' code over rpyc on loopback:

(a) ``default`` — a JODL master, the family on the default strategy
    (earliest expected finish) with the master's balancing, a fresh Master per
    cycle so that everything learned goes through the database;
(b) ``round_robin`` — the same master with the ``round_robin`` strategy;
(c) ``pull`` — a separate tiny dispatcher in this script: one shared queue in
    submission order, and each agent holds at most one job (Celery with
    prefetch 1 and acks late). One thread per agent plays its pulling worker:
    it polls its agent in a tight loop and, as soon as the result is there,
    takes the next job from the queue. It writes nothing to a database and has
    no broker, so it is an idealised pull queue.

    python bench/makespan.py --seeds 1,2,3 --lb 1.5

The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import SECRET, agents, fresh_database  # noqa: E402
from sqlalchemy import select  # noqa: E402

from jodl import Master, Settings, Store, make_engine  # noqa: E402
from jodl.agent import AgentLink  # noqa: E402
from jodl.log import ExecState, Execution, Node  # noqa: E402
from jodl.log.migrate import upgrade  # noqa: E402


def draw_work(seed: int, jobs: int, sigma: float, speeds: list[float], lb: float) -> list[float]:
    """Work of each job (seconds at speed 1.0), scaled so that the cycle's LB is ``lb``."""
    rng = random.Random(seed)
    raw = [rng.lognormvariate(0.0, sigma) for _ in range(jobs)]
    scale = lb / lower_bound(raw, speeds)
    return [w * scale for w in raw]


def lower_bound(work: list[float], speeds: list[float]) -> float:
    return max(sum(work) / sum(speeds), max(work) / max(speeds))


@contextlib.contextmanager
def agent_set(speeds: list[float]) -> Iterator[list[str]]:
    """One-slot agents of these speeds, started again if one of them fails to start."""
    for attempt in range(3):
        stack = contextlib.ExitStack()
        try:
            addresses = stack.enter_context(agents(len(speeds), slots=1, speeds=speeds))
        except RuntimeError:  # e.g. another process took a port between pick and bind
            stack.close()
            if attempt == 2:
                raise
            continue
        with stack:
            yield addresses
        return


def measured_lb(runs: list[tuple[float, float]], speeds: list[float]) -> float:
    """LB of a cycle from (measured seconds, speed of the agent that ran it) per job."""
    return lower_bound([d * s for d, s in runs], speeds)


def run_master(
    strategy: str, work: list[float], speeds: list[float], cycles: int, db: str
) -> list[dict[str, float]]:
    """Cycles of the ``sleep`` family through a JODL master with ``strategy``."""
    out: list[dict[str, float]] = []
    true_lb = lower_bound(work, speeds)
    with fresh_database(db) as url, agent_set(speeds) as addresses:
        engine = make_engine(url)
        upgrade(engine)
        store = Store(engine)
        speed_of = dict(zip(addresses, speeds, strict=True))
        for address in addresses:
            store.add_node(address, slots=1)
        family = store.ensure_family("sleep", strategy=strategy, idempotent=True)
        store.add_jobs(
            family, ((f"job-{i}", json.dumps({"seconds": w})) for i, w in enumerate(work))
        )
        settings = Settings.from_env(env={}, database_url=url, log_level="WARNING", secret=SECRET)
        for _ in range(cycles):
            master = Master(settings, store=store)
            try:
                summary = master.run_cycle("sleep")
            finally:
                master.close()
            if summary.done != len(work) or summary.makespan is None:
                raise SystemExit(f"{strategy}: cycle did {summary.done}/{len(work)} jobs")
            with engine.connect() as conn:
                rows = conn.execute(
                    select(Execution.duration, Node.address)
                    .join(Node, Node.id == Execution.node_id)
                    .where(Execution.run_id == summary.run_id, Execution.state == ExecState.DONE)
                ).all()
            lb = measured_lb([(d, speed_of[a]) for d, a in rows], speeds)
            out.append(
                {
                    "ratio": summary.makespan / lb,
                    "nominal_ratio": summary.makespan / true_lb,
                    "learned_ratio": summary.ratio or float("nan"),
                    "makespan": summary.makespan,
                }
            )
        engine.dispose()
    return out


def pull_worker(
    link: AgentLink,
    speed: float,
    queue: deque[tuple[int, str]],
    measured: list[tuple[float, float]],
    ends: list[float],
) -> None:
    """One agent's pulling worker: next job from the shared queue, wait for it, repeat."""
    acks: tuple[int, ...] = ()
    while True:
        try:
            exec_id, payload = queue.popleft()  # atomic: the shared queue
        except IndexError:
            break
        link.send(1, ((exec_id, "sleep", payload),))
        while True:
            results = link.done(1, acks, 10)
            acks = ()
            if results:
                acks = tuple(r.exec_id for r in results)
                measured.extend((r.duration, speed) for r in results)
                ends.append(time.perf_counter())
                break
    if acks:
        link.ack(1, acks)


def run_pull(work: list[float], speeds: list[float], cycles: int) -> list[dict[str, float]]:
    """Cycles through the pull queue: one shared FIFO, each agent holds one job at a time.

    One thread per agent plays that agent's pulling worker: it takes the next job
    from the shared queue, sends it, polls its agent until the result is there,
    and takes the next one — so an agent waits for work only one round trip.
    """
    out: list[dict[str, float]] = []
    true_lb = lower_bound(work, speeds)
    settings = Settings.from_env(env={}, log_level="WARNING", secret=SECRET)
    with agent_set(speeds) as addresses:
        links = [AgentLink(i, address, settings) for i, address in enumerate(addresses)]
        for link in links:
            link.open("pull-queue", 1)
        ids = iter(range(1, 1 << 62))
        for _ in range(cycles):
            queue = deque((next(ids), json.dumps({"seconds": w})) for w in work)
            measured: list[tuple[float, float]] = []
            ends: list[float] = []

            threads = [
                threading.Thread(target=pull_worker, args=(link, speed, queue, measured, ends))
                for link, speed in zip(links, speeds, strict=True)
            ]
            first_send = time.perf_counter()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if len(measured) != len(work):
                raise SystemExit(f"pull: cycle did {len(measured)}/{len(work)} jobs")
            makespan = max(ends) - first_send
            out.append(
                {
                    "ratio": makespan / measured_lb(measured, speeds),
                    "nominal_ratio": makespan / true_lb,
                    "makespan": makespan,
                }
            )
        for link in links:
            link.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated random seeds")
    parser.add_argument("--speeds", default="1,1,2,4", help="agent speed factors")
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma (tail weight)")
    parser.add_argument("--lb", type=float, default=1.5, help="lower bound of a cycle (seconds)")
    parser.add_argument("--peers", default="default,round_robin,pull")
    parser.add_argument(
        "--database-url",
        default="sqlite",
        help="sqlite (a temp file) or a PostgreSQL server URL to create a database on",
    )
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s]
    speeds = [float(s) for s in args.speeds.split(",") if s]
    peers = [p for p in args.peers.split(",") if p]
    results: dict[str, list[list[dict[str, float]]]] = {p: [] for p in peers}
    for seed in seeds:
        work = draw_work(seed, args.jobs, args.sigma, speeds, args.lb)
        for peer in peers:
            if peer == "pull":
                cycles = run_pull(work, speeds, args.cycles)
            else:
                name = "earliest_finish" if peer == "default" else peer
                cycles = run_master(name, work, speeds, args.cycles, args.database_url)
            results[peer].append(cycles)
            line = " ".join(f"{c['ratio']:.3f}" for c in cycles)
            nominal = " ".join(f"{c['nominal_ratio']:.3f}" for c in cycles)
            learned = " ".join(f"{c['learned_ratio']:.3f}" for c in cycles if "learned_ratio" in c)
            print(
                f"seed {seed} {peer:12s} makespan/LB per cycle: {line}   (nominal {nominal}"
                + (f"; master's learned LB {learned})" if learned else ")"),
                flush=True,
            )
    mean: dict[str, list[float]] = {
        peer: [
            statistics.fmean(run[c]["ratio"] for run in results[peer]) for c in range(args.cycles)
        ]
        for peer in peers
    }
    print("mean makespan/LB over seeds, per cycle:")
    for peer in peers:
        print(f"  {peer:12s} " + " ".join(f"{r:.3f}" for r in mean[peer]))
    figures: dict[str, Any] = {
        "jobs": args.jobs,
        "speeds": speeds,
        "seeds": seeds,
        "lb_s": args.lb,
        **{f"{peer}_ratio": [round(r, 4) for r in mean[peer]] for peer in peers},
    }
    if "default" in mean:
        d = mean["default"]
        worst = [max(run[c]["ratio"] for run in results["default"]) for c in range(args.cycles)]
        figures["default_worst_seed_ratio"] = [round(r, 4) for r in worst]
        figures["cycle1_ok"] = d[0] <= 1.3
        figures["from_cycle3_ok"] = all(r <= 1.05 for r in d[2:])
        if "pull" in mean:
            margins = [mean["pull"][c] - d[c] for c in range(1, args.cycles)]
            figures["margin_vs_pull_from_cycle2"] = [round(m, 4) for m in margins]
            figures["beats_pull_from_cycle2"] = all(m > 0 for m in margins)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
