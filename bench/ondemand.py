"""On-demand jobs per second through the queue on PostgreSQL, against peers.

JODL: a master serves with a queue feeder and K agent subprocesses; once it is
up, N no-op jobs are enqueued (``enqueue_many`` in batches) and the clock runs
until the last one is committed done — enqueue, SKIP LOCKED claim, placement,
send, run, result and attempt-guarded completion, every attempt in the log. On
PostgreSQL the end is heard, not polled for: the notices that announce ended jobs
at their commit (what an application waiting for results listens to); pgqueuer's
end is a count of its table polled every 20 ms on one connection.
Also measured: the bare queue (enqueue, then K threads claiming and completing
in batches, no agents), which is what PostgreSQL queue libraries usually report.

Peers, in the same invocation and the same enqueue-to-done measure:

* pgqueuer (PostgreSQL, LISTEN/NOTIFY, K worker processes) when installed
  (``pip install pgqueuer``);
* Celery with the Redis broker on 127.0.0.1:6379 (K prefork workers) when Redis
  answers.

The last line printed is one JSON object with the figures.

    python bench/ondemand.py --jobs 20000 --agents 2

(Not named queue.py: the script's folder comes first on sys.path, and a queue.py
there would stand in for the standard library's queue module in every benchmark.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import DEFAULT_PG, SECRET, agents, fresh_database, stop_all  # noqa: E402

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from jodl import Store
    from jodl.queue import Queue

#: Jobs per enqueue call.
ENQUEUE_BATCH = 5000


#: The serving master of :func:`run_jodl`, in a process of its own as it is deployed
#: (pgqueuer's workers run in theirs): the master and its queue feeder, until SIGTERM.
#: In the benchmark's process it shared one interpreter lock with the enqueuing and the
#: watching: 0.85-0.94 x pgqueuer, 1.07-1.08 x in a process of its own (the same code,
#: alternating runs of 20,000 jobs).
MASTER = """
import signal, threading
from jodl import Master, Settings
from jodl.queue import Queue, QueueFeeder

master = Master(Settings.from_env())
master.feeders.append(QueueFeeder(Queue(master.store)))
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
try:
    master.serve(stop)
finally:
    master.close()
"""


def run_jodl(url: str, jobs: int, agent_count: int, slots: int) -> dict[str, float]:
    """Enqueue-to-done through a serving master (its own process) and real agents."""
    from jodl import Store, make_engine
    from jodl.log.migrate import upgrade
    from jodl.queue import Queue

    with fresh_database(url) as db_url, agents(agent_count, slots=slots) as addresses:
        engine = make_engine(db_url, pool_size=10)
        upgrade(engine)
        store = Store(engine)
        for address in addresses:
            store.add_node(address, slots=slots)
        queue = Queue(store)
        queue.family_id("noop", create=True)
        env = {
            **os.environ,
            "JODL_DATABASE_URL": db_url,
            "JODL_SECRET": SECRET,
            "JODL_LOG_LEVEL": "WARNING",
        }
        master = subprocess.Popen([sys.executable, "-c", MASTER], env=env)
        try:
            return _enqueue_and_wait(engine, store, queue, jobs, agent_count, master)
        finally:
            stop_all([master], wait=30)
            queue.close()
            engine.dispose()


def _enqueue_and_wait(
    engine: Engine,
    store: Store,
    queue: Queue,
    jobs: int,
    agent_count: int,
    master: subprocess.Popen[bytes],
) -> dict[str, float]:
    """The measured part of :func:`run_jodl`, once the master serves with every agent."""
    from sqlalchemy import text

    from jodl.log import ResultWatch

    # Served: a few warm-up jobs done, a slot's worth per agent (pgqueuer's workers are
    # warmed up so too), once the master leads.
    warm = [f"warm-{i}" for i in range(agent_count * 4)]
    deadline = time.monotonic() + 60
    while store.lease_holder() is None:
        if master.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the master did not start")
        time.sleep(0.05)
    queue.enqueue_many("noop", warm)
    while queue.counts("noop")["noop"]["done"] < len(warm):
        if master.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the master and agents did not serve")
        time.sleep(0.02)
    # Ended jobs are announced at their commit: on PostgreSQL the clock stops when
    # the last one is heard of (a ResultWatch, as an application waits for results),
    # the count of the jobs not done read only when a second passes unheard of.
    # Polled every 20 ms, that count took 15 ms a query and a third of a core from
    # the database the master and the queue work in. SQLite announces nothing
    # across connections: its count is read in this process, every 20 ms.
    postgres = engine.dialect.name == "postgresql"
    watch = ResultWatch(engine)
    heard = watch.subscribe(())
    try:
        left = text("SELECT count(*) FROM jodl_job WHERE state IN ('queued', 'claimed')")

        def not_done() -> int:
            with engine.connect() as conn:
                return int(conn.scalar(left) or 0)

        waiting: set[int] = set()
        started = time.perf_counter()
        for start in range(0, jobs, ENQUEUE_BATCH):
            ids = queue.enqueue_many(
                "noop", (f"j{i}" for i in range(start, min(jobs, start + ENQUEUE_BATCH)))
            )
            waiting.update(ids)
            heard.add(ids)  # at once: the first of them ends milliseconds later at best
        enqueued = time.perf_counter() - started
        while waiting:
            if postgres and heard.wait(1.0):
                noticed = heard.take()
                waiting -= noticed.job_ids
                if not noticed.everything:
                    continue
            elif not postgres:
                time.sleep(0.02)
            if not not_done():  # a notice missed, or SQLite
                break
            if master.poll() is not None:
                raise SystemExit("the master stopped")
        seconds = time.perf_counter() - started
        if (done := queue.counts("noop")["noop"]["done"]) != jobs + len(warm):
            raise SystemExit(f"jodl: {done - len(warm)} of {jobs} jobs done")
    finally:
        heard.close()
        watch.close()
    return {"seconds": seconds, "enqueue_seconds": enqueued, "jobs_per_s": jobs / seconds}


def run_bare_queue(url: str, jobs: int, consumers: int, batch: int) -> dict[str, float]:
    """Enqueue N jobs, then K threads claim and complete them in batches (no agents)."""
    from jodl import make_engine
    from jodl.log.migrate import upgrade
    from jodl.queue import Queue

    with fresh_database(url) as db_url:
        engine = make_engine(db_url, pool_size=consumers + 2)
        upgrade(engine)
        queue = Queue(engine)
        started = time.perf_counter()
        for start in range(0, jobs, ENQUEUE_BATCH):
            queue.enqueue_many(
                "noop", (f"j{i}" for i in range(start, min(jobs, start + ENQUEUE_BATCH)))
            )
        enqueue_seconds = time.perf_counter() - started
        done = [0] * consumers

        def consume(i: int) -> None:
            mine = Queue(engine)
            while claimed := mine.claim(batch, 60.0):
                done[i] += mine.complete_many([(c.id, c.attempt) for c in claimed])

        threads = [threading.Thread(target=consume, args=(i,)) for i in range(consumers)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - started
        engine.dispose()
    if sum(done) != jobs:
        raise SystemExit(f"bare queue: {sum(done)} of {jobs} completed")
    return {
        "enqueue_per_s": jobs / enqueue_seconds,
        "claim_complete_per_s": jobs / seconds,
    }


PGQUEUER_WORKER = """
import asyncio, sys
import psycopg
from pgqueuer import PsycopgDriver, Queries, QueueManager

async def main(dsn: str, batch: int) -> None:
    conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    qm = QueueManager(Queries(PsycopgDriver(conn)))

    @qm.entrypoint("noop")
    async def noop(job) -> None:
        return None

    await qm.run(batch_size=batch)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def run_pgqueuer(url: str, jobs: int, workers: int, batch: int) -> dict[str, float] | str:
    """The same no-op jobs through pgqueuer; why not when it is not installed."""
    try:
        import asyncio

        import psycopg
        from pgqueuer import PsycopgDriver, Queries
    except ImportError:
        return "skipped: pgqueuer not installed (pip install '.[bench]')"
    from sqlalchemy import make_url

    with fresh_database(url) as db_url:
        dsn = make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)

        async def setup_and_enqueue(count: int, install: bool) -> float:
            conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
            queries = Queries(PsycopgDriver(conn))
            if install:
                await queries.install()
            started = time.perf_counter()
            for start in range(0, count, ENQUEUE_BATCH):
                n = min(count, start + ENQUEUE_BATCH) - start
                await queries.enqueue(["noop"] * n, [None] * n, [0] * n)
            await conn.close()
            return time.perf_counter() - started

        # One connection for the whole watch: a new one each poll cost the database a
        # backend's start every 20 ms.
        watching = psycopg.connect(dsn, autocommit=True)

        def remaining() -> int:
            row = watching.execute("SELECT count(*) FROM pgqueuer").fetchone()
            return int(row[0]) if row else 0

        asyncio.run(setup_and_enqueue(0, install=True))
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", PGQUEUER_WORKER, dsn, str(batch)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for _ in range(workers)
        ]
        try:
            asyncio.run(setup_and_enqueue(workers * 4, install=False))  # warm-up: workers are up
            deadline = time.monotonic() + 60
            while remaining():
                if time.monotonic() > deadline:
                    raise SystemExit("pgqueuer workers did not start")
                time.sleep(0.05)
            started = time.perf_counter()
            enqueued = asyncio.run(setup_and_enqueue(jobs, install=False))
            while remaining():
                time.sleep(0.02)
            seconds = time.perf_counter() - started
        finally:
            watching.close()
            stop_all(procs)
    return {"seconds": seconds, "enqueue_seconds": enqueued, "jobs_per_s": jobs / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="no-op jobs through each system")
    parser.add_argument("--agents", type=int, default=2, help="JODL agents = peer workers")
    parser.add_argument("--slots", type=int, default=2, help="slots per JODL agent")
    parser.add_argument(
        "--batch",
        type=int,
        default=500,
        help="claim batch of the bare queue and of pgqueuer (500: pgqueuer's best here)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="JODL and pgqueuer run alternately this many times; medians are reported",
    )
    parser.add_argument(
        "--db-url",
        default=os.environ.get("JODL_TEST_DATABASE_URL", DEFAULT_PG),
        help="PostgreSQL server for fresh databases (sqlite:// for SQLite, JODL only)",
    )
    parser.add_argument("--celery-jobs", type=int, default=5_000, help="0 skips Celery")
    parser.add_argument("--no-pgqueuer", action="store_true", help="skip the pgqueuer peer")
    args = parser.parse_args()
    postgres = not args.db_url.startswith("sqlite")

    figures: dict[str, Any] = {
        "jobs": args.jobs,
        "agents": args.agents,
        "db": "postgresql" if postgres else "sqlite",
    }
    # Alternate the systems so that a busy moment of the machine hits both.
    ours: list[float] = []
    theirs: list[float] = []
    if not postgres:
        figures["pgqueuer"] = "skipped: needs PostgreSQL"
    elif args.no_pgqueuer:
        figures["pgqueuer"] = "skipped: --no-pgqueuer"
    for _ in range(max(1, args.rounds)):
        jodl = run_jodl(args.db_url, args.jobs, args.agents, args.slots)
        ours.append(jodl["jobs_per_s"])
        print(
            f"jodl queue -> master -> agents: {args.jobs} jobs in {jodl['seconds']:.2f}s = "
            f"{jodl['jobs_per_s']:.0f} jobs/s (enqueueing took {jodl['enqueue_seconds']:.2f}s)"
        )
        if "pgqueuer" not in figures:
            peer = run_pgqueuer(args.db_url, args.jobs, args.agents, args.batch)
            if isinstance(peer, str):
                print(f"pgqueuer: {peer}")
                figures["pgqueuer"] = peer
            else:
                theirs.append(peer["jobs_per_s"])
                print(
                    f"pgqueuer: {args.jobs} jobs in {peer['seconds']:.2f}s = "
                    f"{peer['jobs_per_s']:.0f} jobs/s "
                    f"(enqueueing took {peer['enqueue_seconds']:.2f}s)"
                )
    figures["jobs_per_s"] = round(statistics.median(ours))
    if theirs:
        figures["pgqueuer_jobs_per_s"] = round(statistics.median(theirs))
        figures["ratio_pgqueuer"] = round(statistics.median(ours) / statistics.median(theirs), 2)
    bare = run_bare_queue(args.db_url, args.jobs, args.agents, args.batch)
    print(
        f"jodl bare queue: enqueue {bare['enqueue_per_s']:.0f}/s, "
        f"claim+complete {bare['claim_complete_per_s']:.0f}/s ({args.agents} consumers)"
    )
    figures["enqueue_per_s"] = round(bare["enqueue_per_s"])
    figures["claim_complete_per_s"] = round(bare["claim_complete_per_s"])
    from throughput import celery_peer

    celery = celery_peer(args.celery_jobs, args.agents, figures)
    if celery is not None:
        figures["celery_jobs_per_s"] = round(celery)
        figures["ratio_celery"] = round(statistics.median(ours) / celery, 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
