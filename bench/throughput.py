"""Throughput of no-op jobs through one master and K agents, every attempt logged.

Runs N no-op jobs as cycles of the ``noop`` family on K agent subprocesses with
the reconstruction log on PostgreSQL (default) and reports jobs/s and µs per job
for each cycle: the first places jobs never seen before (and records where they
ran), the next ones run them with what was learned. Every attempt is logged.
In the same invocation it runs the same no-op tasks through Celery (Redis broker
and result backend on 127.0.0.1:6379, K prefork worker processes), the most
common peer, so the ratio holds on a noisy machine. The last line printed is
one JSON object with the figures.

    python bench/throughput.py --jobs 100000 --agents 2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import DEFAULT_PG, SECRET, agents, fresh_database  # noqa: E402


def run_jodl(url: str, jobs: int, agent_count: int, slots: int, cycles: int) -> dict[str, Any]:
    from sqlalchemy import func, select

    from jodl import Master, Settings, Store, make_engine
    from jodl.log import ExecState, Execution
    from jodl.log.migrate import upgrade

    with fresh_database(url) as db_url, agents(agent_count, slots=slots) as addresses:
        engine = make_engine(db_url)
        upgrade(engine)
        store = Store(engine)
        for address in addresses:
            store.add_node(address, slots=slots)
        family = store.ensure_family("noop")
        started = time.perf_counter()
        store.add_jobs(family, ((f"job-{i}", "{}") for i in range(jobs)))
        add_seconds = time.perf_counter() - started
        settings = Settings(database_url=db_url, log_level="WARNING", secret=SECRET)
        master = Master(settings, store=store)
        master.start()  # connecting the agents is not part of a cycle
        seconds = []
        for _ in range(cycles):
            started = time.perf_counter()
            summary = master.run_cycle("noop")
            seconds.append(time.perf_counter() - started)
            if summary.done != jobs:
                raise SystemExit(f"expected {jobs} results, got {summary.done}")
        master.close()
        with engine.connect() as conn:
            logged = conn.scalar(
                select(func.count()).select_from(Execution).where(Execution.state == ExecState.DONE)
            )
        engine.dispose()
    if logged != jobs * cycles:
        raise SystemExit(f"expected {jobs * cycles} committed results, {logged} logged")
    return {
        "seconds": seconds,
        "add_seconds": add_seconds,
        "jobs_per_s": [jobs / s for s in seconds],
        "us_per_job": [s / jobs * 1e6 for s in seconds],
    }


CELERY_APP = """
from celery import Celery
app = Celery("bench", broker="redis://{redis}/14", backend="redis://{redis}/14")
app.conf.update(worker_prefetch_multiplier=4, task_acks_late=False, result_expires=600,
                worker_hijack_root_logger=False)

@app.task
def noop():
    return None
"""


#: Where the Celery peer's broker and result backend must answer.
REDIS = "127.0.0.1:6379"


def run_celery(jobs: int, workers: int) -> dict[str, float] | str:
    """The same no-op tasks through Celery + Redis; why not when Celery or Redis is missing."""
    try:
        import redis  # noqa: F401
        from celery import group  # noqa: F401
    except ImportError:
        return "skipped: celery not installed (pip install '.[bench]')"
    import tempfile

    tmp = tempfile.mkdtemp()
    with open(os.path.join(tmp, "benchapp.py"), "w") as fh:
        fh.write(CELERY_APP.format(redis=REDIS))
    sys.path.insert(0, tmp)
    import benchapp  # type: ignore[import-not-found]

    try:
        benchapp.app.backend.client.ping()
    except Exception:  # noqa: BLE001 - Redis not running: no peer figures
        return f"skipped: redis not answering on {REDIS}"
    benchapp.app.backend.client.flushdb()
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "benchapp",
            "worker",
            "--pool",
            "prefork",
            "--concurrency",
            str(workers),
            "--loglevel",
            "WARNING",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
        ],
        cwd=tmp,
        env={**os.environ, "PYTHONPATH": tmp},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        benchapp.noop.delay().get(timeout=60)  # worker is up
        started = time.perf_counter()
        results = [benchapp.noop.delay() for _ in range(jobs)]
        for result in results:
            result.get(timeout=300)
        seconds = time.perf_counter() - started
    finally:
        worker.terminate()
        try:
            worker.wait(10)
        except subprocess.TimeoutExpired:
            worker.kill()
    return {"seconds": seconds, "jobs_per_s": jobs / seconds}


def celery_peer(jobs: int, workers: int, figures: dict[str, Any]) -> float | None:
    """Run the Celery peer (unless ``jobs`` is 0), print its line, return its tasks/s.

    A peer that cannot run is skipped with a printed note, and ``figures["celery"]``
    says why, so a missing peer never passes for a broken one."""
    celery = run_celery(jobs, workers) if jobs else "skipped: --celery-jobs 0"
    if isinstance(celery, str):
        print(f"celery: {celery}")
        figures["celery"] = celery
        return None
    print(f"celery: {jobs} tasks in {celery['seconds']:.2f}s = {celery['jobs_per_s']:.0f} tasks/s")
    return float(celery["jobs_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=100_000, help="no-op jobs through JODL")
    parser.add_argument("--agents", type=int, default=2, help="agent processes")
    parser.add_argument("--slots", type=int, default=2, help="slots per agent")
    parser.add_argument(
        "--cycles",
        type=int,
        default=2,
        help="cycles of the same jobs: the first places jobs never seen, "
        "later ones run them where they were learned",
    )
    parser.add_argument(
        "--db-url",
        default=os.environ.get("JODL_TEST_DATABASE_URL", DEFAULT_PG),
        help="server for a fresh database (PostgreSQL) or sqlite:// for SQLite",
    )
    parser.add_argument(
        "--celery-jobs",
        type=int,
        default=10_000,
        help="no-op tasks through Celery (0 to skip the peer)",
    )
    args = parser.parse_args()

    jodl = run_jodl(args.db_url, args.jobs, args.agents, args.slots, args.cycles)
    for i, (secs, rate) in enumerate(zip(jodl["seconds"], jodl["jobs_per_s"], strict=True), 1):
        print(
            f"jodl cycle {i}: {args.jobs} jobs in {secs:.2f}s = {rate:.0f} jobs/s "
            f"({secs / args.jobs * 1e6:.1f} us/job)"
        )
    print(f"(adding the jobs took {jodl['add_seconds']:.2f}s)")
    figures: dict[str, Any] = {
        "jobs": args.jobs,
        "agents": args.agents,
        "db": "sqlite" if args.db_url.startswith("sqlite") else "postgresql",
        "jobs_per_s": round(max(jodl["jobs_per_s"])),
        "first_cycle_jobs_per_s": round(jodl["jobs_per_s"][0]),
        "cycles_jobs_per_s": [round(r) for r in jodl["jobs_per_s"]],
        "add_jobs_per_s": round(args.jobs / jodl["add_seconds"]),
        "us_per_job": round(min(jodl["us_per_job"]), 1),
    }
    celery = celery_peer(args.celery_jobs, args.agents, figures)
    if celery is not None:
        figures["celery_jobs_per_s"] = round(celery)
        figures["ratio"] = round(figures["jobs_per_s"] / celery, 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
