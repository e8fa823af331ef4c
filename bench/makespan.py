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

``--case hard`` (or ``both``) runs a harder case through the two JODL peers: 32
one-slot agents of mixed speeds (``--hard-agents``), 10,000 jobs (``--hard-jobs``)
of the same lognormal work scaled to an LB of ``--hard-lb`` seconds, three cycles,
and in the last one an agent (speed 2) is killed (SIGKILL) ``--hard-lb`` ÷ 2 after
the cycle's first send: its jobs are placed again once the master gives it up
(``JODL_CALL_TIMEOUT`` 4 s, so its agent would have detached after 2 s;
``JODL_NODE_GRACE`` 1 s), the same settings for both peers. That cycle's LB counts
the dead agent's capacity until the kill only: the least T with

    total speed × min(T, t_kill) + (total speed − its speed) × max(0, T − t_kill) ≥ work

(and the longest job ÷ fastest node). The pull queue is not run there: 32 polling
threads would take the two cores the agents need.

The last line printed is one JSON object with the figures (the hard case's under
keys starting with ``hard_``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import SECRET, agents, fresh_database  # noqa: E402
from sqlalchemy import Engine, func, select  # noqa: E402

from jodl import Master, Settings, Store, make_engine  # noqa: E402
from jodl.agent import AgentLink  # noqa: E402
from jodl.log import Dispatch, ExecState, Execution, Node  # noqa: E402
from jodl.log.migrate import upgrade  # noqa: E402

#: The hard case's agent speeds, repeated over its agents (mean 1.72).
HARD_SPEEDS = (2.0, 1.0, 0.5, 4.0, 1.0, 1.5, 3.0, 0.75)
#: The hard case's master settings (both peers): a dead agent is given up on within a
#: few seconds (its agent detaches after half the call timeout).
HARD_ENV = {"JODL_CALL_TIMEOUT": "4", "JODL_NODE_GRACE": "1"}


def draw_work(seed: int, jobs: int, sigma: float, speeds: list[float], lb: float) -> list[float]:
    """Work of each job (seconds at speed 1.0), scaled so that the cycle's LB is ``lb``."""
    rng = random.Random(seed)
    raw = [rng.lognormvariate(0.0, sigma) for _ in range(jobs)]
    scale = lb / lower_bound(raw, speeds)
    return [w * scale for w in raw]


def lower_bound(work: list[float], speeds: list[float]) -> float:
    return max(sum(work) / sum(speeds), max(work) / max(speeds))


@contextlib.contextmanager
def agent_set(
    speeds: list[float], procs: list[subprocess.Popen[bytes]] | None = None
) -> Iterator[list[str]]:
    """One-slot agents of these speeds, started again if one of them fails to start.

    ``procs``: filled with the agents' processes, in the order of their addresses.
    """
    for attempt in range(3):
        stack = contextlib.ExitStack()
        if procs is not None:
            procs.clear()
        try:
            addresses = stack.enter_context(
                agents(len(speeds), slots=1, speeds=speeds, procs=procs)
            )
        except RuntimeError:  # e.g. another process took a port between pick and bind
            stack.close()
            if attempt == 2:
                raise
            continue
        with stack:
            yield addresses
        return


def measured_lb(
    runs: list[tuple[float, float]], speeds: list[float], lost: tuple[float, float] | None = None
) -> float:
    """LB of a cycle from (measured seconds, speed of the agent that ran it) per job.

    ``lost``: (speed, seconds after the first send) of an agent that died in the
    cycle: its capacity counts until then only.
    """
    work = [d * s for d, s in runs]
    if lost is None:
        return lower_bound(work, speeds)
    speed, at = lost
    total, capacity = sum(work), sum(speeds)
    if total <= capacity * at:
        return lower_bound(work, speeds)
    return max((total - speed * at) / (capacity - speed), max(work) / max(speeds))


@dataclass
class Kill:
    """Kill agent ``agent`` (SIGKILL) ``after`` seconds past the first send of cycle
    ``cycle`` (0-based); ``at`` is then when it died, in seconds after that send."""

    cycle: int
    agent: int
    after: float
    at: float | None = None

    def start(self, engine: Engine, proc: subprocess.Popen[bytes]) -> threading.Thread:
        """A thread that waits for the next run's first send (the first dispatch logged
        from now on), then for ``after`` seconds, and kills ``proc``."""
        with engine.connect() as conn:
            logged = conn.execute(select(func.max(Dispatch.id))).scalar() or 0

        def wait_and_kill() -> None:
            first = None
            while first is None:
                time.sleep(0.01)
                with engine.connect() as conn:
                    first = conn.execute(
                        select(func.min(Dispatch.sent_at)).where(Dispatch.id > logged)
                    ).scalar()
            sent = first.replace(tzinfo=dt.UTC).timestamp()
            time.sleep(max(0.0, sent + self.after - time.time()))
            proc.kill()
            self.at = time.time() - sent

        thread = threading.Thread(target=wait_and_kill, name="kill-agent", daemon=True)
        thread.start()
        return thread


def run_master(
    strategy: str,
    work: list[float],
    speeds: list[float],
    cycles: int,
    db: str,
    kill: Kill | None = None,
    env: dict[str, str] | None = None,
) -> list[dict[str, float]]:
    """Cycles of the ``sleep`` family through a JODL master with ``strategy``.

    ``kill``: an agent killed in one of the cycles; ``env``: the master's settings.
    """
    out: list[dict[str, float]] = []
    true_lb = lower_bound(work, speeds)
    procs: list[subprocess.Popen[bytes]] = []
    with fresh_database(db) as url, agent_set(speeds, procs) as addresses:
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
        settings = Settings.from_env(
            env=env or {}, database_url=url, log_level="WARNING", secret=SECRET
        )
        alive = list(speeds)
        for cycle in range(cycles):
            dying = kill if kill is not None and kill.cycle == cycle else None
            killer = dying.start(engine, procs[dying.agent]) if dying is not None else None
            master = Master(settings, store=store)
            try:
                summary = master.run_cycle("sleep")
            finally:
                master.close()
            if killer is not None:
                killer.join()
            if summary.done != len(work) or summary.makespan is None:
                raise SystemExit(f"{strategy}: cycle did {summary.done}/{len(work)} jobs")
            with engine.connect() as conn:
                rows = conn.execute(
                    select(Execution.duration, Node.address)
                    .join(Node, Node.id == Execution.node_id)
                    .where(Execution.run_id == summary.run_id, Execution.state == ExecState.DONE)
                ).all()
            lost = None
            if dying is not None and dying.at is not None:
                lost = (speeds[dying.agent], dying.at)
            lb = measured_lb([(d, speed_of[a]) for d, a in rows], alive, lost)
            if dying is not None:
                alive = [s for i, s in enumerate(speeds) if i != dying.agent]
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


def standard_case(args: argparse.Namespace) -> dict[str, Any]:
    """Four agents of ``--speeds``, every peer, every seed: the figures of the JSON line."""
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
            print_cycles(f"seed {seed} {peer:12s}", cycles)
    mean = mean_ratios(results, args.cycles)
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
        figures["from_cycle3_ok"] = all(r <= 1.02 for r in d[2:])
        if "round_robin" in mean:
            # every seed, every cycle from the third: the learning strategy ends first
            figures["beats_round_robin_from_cycle3"] = all(
                mine[c]["ratio"] < theirs[c]["ratio"]
                for mine, theirs in zip(results["default"], results["round_robin"], strict=True)
                for c in range(2, args.cycles)
            )
        if "pull" in mean:
            margins = [mean["pull"][c] - d[c] for c in range(1, args.cycles)]
            figures["margin_vs_pull_from_cycle2"] = [round(m, 4) for m in margins]
            figures["beats_pull_from_cycle2"] = all(m > 0 for m in margins)
    return figures


def hard_speeds(count: int) -> list[float]:
    return [HARD_SPEEDS[i % len(HARD_SPEEDS)] for i in range(count)]


def hard_case(args: argparse.Namespace) -> dict[str, Any]:
    """Many agents of mixed speeds, many jobs, an agent killed in the last cycle."""
    speeds = hard_speeds(args.hard_agents)
    seeds = [int(s) for s in args.hard_seeds.split(",") if s]
    peers = ("default", "round_robin")
    results: dict[str, list[list[dict[str, float]]]] = {p: [] for p in peers}
    killed_at: dict[str, list[float]] = {p: [] for p in peers}
    for seed in seeds:
        work = draw_work(seed, args.hard_jobs, args.sigma, speeds, args.hard_lb)
        for peer in peers:
            kill = Kill(cycle=args.hard_cycles - 1, agent=0, after=args.hard_lb / 2)
            name = "earliest_finish" if peer == "default" else peer
            cycles = run_master(
                name, work, speeds, args.hard_cycles, args.database_url, kill, HARD_ENV
            )
            results[peer].append(cycles)
            killed_at[peer].append(round(kill.at or 0.0, 3))
            print_cycles(f"hard seed {seed} {peer:12s}", cycles)
    mean = mean_ratios(results, args.hard_cycles)
    print(f"hard case ({len(speeds)} agents, {args.hard_jobs} jobs, an agent killed in the")
    print(f"last cycle), mean makespan/LB over seeds {seeds}, per cycle:")
    for peer in peers:
        print(f"  {peer:12s} " + " ".join(f"{r:.3f}" for r in mean[peer]))
    d, rr = mean["default"], mean["round_robin"]
    return {
        "hard_agents": len(speeds),
        "hard_speeds_total": sum(speeds),
        "hard_jobs": args.hard_jobs,
        "hard_seeds": seeds,
        "hard_lb_s": args.hard_lb,
        "hard_killed_after_s": killed_at,
        **{f"hard_{peer}_ratio": [round(r, 4) for r in mean[peer]] for peer in peers},
        "hard_margin_vs_round_robin": [round(rr[c] - d[c], 4) for c in range(args.hard_cycles)],
        "hard_beats_round_robin_from_cycle2": all(
            mine[c]["ratio"] < theirs[c]["ratio"]
            for mine, theirs in zip(results["default"], results["round_robin"], strict=True)
            for c in range(1, args.hard_cycles)
        ),
    }


def print_cycles(label: str, cycles: list[dict[str, float]]) -> None:
    line = " ".join(f"{c['ratio']:.3f}" for c in cycles)
    nominal = " ".join(f"{c['nominal_ratio']:.3f}" for c in cycles)
    learned = " ".join(f"{c['learned_ratio']:.3f}" for c in cycles if "learned_ratio" in c)
    print(
        f"{label} makespan/LB per cycle: {line}   (nominal {nominal}"
        + (f"; master's learned LB {learned})" if learned else ")"),
        flush=True,
    )


def mean_ratios(
    results: dict[str, list[list[dict[str, float]]]], cycles: int
) -> dict[str, list[float]]:
    return {
        peer: [statistics.fmean(run[c]["ratio"] for run in runs) for c in range(cycles)]
        for peer, runs in results.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=("standard", "hard", "both"), default="standard")
    parser.add_argument("--jobs", type=int, default=400)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--seeds", default="1,2,3", help="comma-separated random seeds")
    parser.add_argument("--speeds", default="1,1,2,4", help="agent speed factors")
    parser.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma (tail weight)")
    parser.add_argument("--lb", type=float, default=1.5, help="lower bound of a cycle (seconds)")
    parser.add_argument("--peers", default="default,round_robin,pull")
    parser.add_argument("--hard-agents", type=int, default=32)
    parser.add_argument("--hard-jobs", type=int, default=10_000)
    parser.add_argument("--hard-cycles", type=int, default=3, help="the last one kills an agent")
    parser.add_argument("--hard-seeds", default="1", help="comma-separated random seeds")
    parser.add_argument("--hard-lb", type=float, default=8.0, help="LB of a cycle (seconds)")
    parser.add_argument(
        "--database-url",
        default="sqlite",
        help="sqlite (a temp file) or a PostgreSQL server URL to create a database on",
    )
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    if args.case in ("standard", "both"):
        figures.update(standard_case(args))
    if args.case in ("hard", "both"):
        figures.update(hard_case(args))
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
