"""Throughput of no-op jobs through one master and K agents, every attempt logged.

Runs N no-op jobs as cycles of the ``noop`` family on K agent subprocesses with
the reconstruction log on PostgreSQL (default) and reports jobs/s and µs per job
for each cycle: the first places jobs never seen before (and records where they
ran), the next ones run them with what was learned. Every attempt is logged.

Adding the jobs is measured too: ``add_jobs_per_s`` through the library
(``Store.add_jobs``, the jobs of the cycles) and ``cli_add_jobs_per_s`` through
``jodl jobs add --from FILE`` (a JSON Lines file, into a fresh database).

Beside it, in the same invocation (so the ratios hold on a noisy machine):

* the floor: a bare loop over the same agent processes that ships the same no-op
  jobs over rpyc in the master's batch size (``send``, polls ``done``, acknowledges)
  and COPYs the same execution rows into ``jodl_execution`` of a fresh database,
  with no placement, learning, balancing or write-ahead dispatch rows: the cost
  JODL cannot avoid, the wire and the log (``ratio_floor``: JODL ÷ floor; target
  at least 0.5);
* the peers, the same no-op tasks on Redis (127.0.0.1:6379) with K worker
  processes, each task's result stored there and read back by the client: Celery
  (prefork), the most common one (``ratio``), and Dramatiq, a leaner one
  (``ratio_dramatiq``; target at least 10). A peer that is not
  installed (``pip install '.[bench]'``) or finds no Redis is skipped, and the
  JSON says so.

The last line printed is one JSON object with the figures.

    python bench/throughput.py --jobs 100000 --agents 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import DEFAULT_PG, SECRET, agents, fresh_database  # noqa: E402


def run_jodl(url: str, jobs: int, addresses: list[str], slots: int, cycles: int) -> dict[str, Any]:
    from sqlalchemy import func, select

    from jodl import Master, Settings, Store, make_engine
    from jodl.log import ExecState, Execution
    from jodl.log.migrate import upgrade

    with fresh_database(url) as db_url:
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
        epoch = master.epoch
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
        "epoch": epoch,
    }


def run_cli_add(url: str, jobs: int) -> float:
    """Seconds ``jodl jobs add noop --from FILE`` takes to add a JSON Lines file of
    ``jobs`` jobs (each its own payload) to a fresh database: the command run in this
    process, from reading the file to the commit (the interpreter's start aside): the
    installed ``jodl`` command's entry point, called here."""
    from importlib.metadata import entry_points

    from jodl import make_engine
    from jodl.log.migrate import upgrade

    (command,) = entry_points(group="console_scripts", name="jodl")
    main = command.load()

    with (
        fresh_database(url) as db_url,
        tempfile.NamedTemporaryFile("w", suffix=".jsonl") as lines,
    ):
        lines.writelines(f'{{"key": "job-{i}", "payload": {{"n": {i}}}}}\n' for i in range(jobs))
        lines.flush()
        engine = make_engine(db_url)
        upgrade(engine)
        engine.dispose()
        started = time.perf_counter()
        main.main(
            ["--database-url", db_url, "jobs", "add", "noop", "--from", lines.name],
            standalone_mode=False,
        )
        return time.perf_counter() - started


#: Results asked of one agent per ``done`` call, as the master asks (its COLLECT_LIMIT).
COLLECT_LIMIT = 10_000
#: The floor's first execution id: past those of the JODL part (an agent refuses an
#: execution id it already knows).
FLOOR_FIRST_ID = 10**12


def run_floor(
    url: str, jobs: int, addresses: list[str], cycles: int, after_epoch: int
) -> dict[str, Any]:
    """The floor: the same no-op jobs over the wire and into the log, and nothing else.

    One thread per agent runs a bare loop on an :class:`~jodl.agent.AgentLink`: keep
    up to ``batch_size`` jobs (the master's setting) in flight on it, sent in one
    ``send`` call; ask ``done`` for up to :data:`COLLECT_LIMIT` results; COPY their
    execution rows (the columns and values the master writes) into ``jodl_execution``
    of a fresh database and commit; acknowledge them with the next call. The jobs are
    split evenly between the agents up front. No jobs table, placement, learning,
    balancing, write-ahead dispatch rows or runs. ``after_epoch``: the epoch the
    JODL part served the agents at (the floor serves them at the next one).
    """
    import datetime as dt
    from concurrent.futures import ThreadPoolExecutor

    from sqlalchemy import func, insert, select

    from jodl import Settings, make_engine
    from jodl.agent import AgentLink
    from jodl.log import ExecState, Execution
    from jodl.log.migrate import upgrade

    epoch0 = dt.datetime(1970, 1, 1)
    columns = [c.name for c in Execution.__table__.columns]

    with fresh_database(url) as db_url:
        engine = make_engine(db_url)
        upgrade(engine)
        settings = Settings(database_url=db_url, log_level="WARNING", secret=SECRET)
        batch = settings.batch_size
        epoch = after_epoch + 1
        links = [AgentLink(i, a, settings) for i, a in enumerate(addresses, 1)]
        for link in links:
            link.open("floor", epoch)
        postgres = engine.dialect.name == "postgresql"

        def copy(conn: Any, rows: list[tuple[Any, ...]]) -> None:
            if not postgres:
                conn.execute(insert(Execution), [dict(zip(columns, r, strict=True)) for r in rows])
                return
            raw = conn.connection.driver_connection
            with (
                raw.cursor() as cur,
                cur.copy(
                    f"COPY jodl_execution ({', '.join(columns)}) FROM STDIN (FORMAT BINARY)"
                ) as out,
            ):
                out.set_types(oids)
                for row in rows:
                    out.write_row(row)

        oids: list[int] = []
        if postgres:
            with engine.connect() as conn:
                found = conn.exec_driver_sql(
                    "SELECT attname, atttypid::int FROM pg_attribute "
                    "WHERE attrelid = 'jodl_execution'::regclass AND attnum > 0"
                )
                types: dict[str, int] = {name: oid for name, oid in found}
            oids = [types[c] for c in columns]

        def one_agent(link: AgentLink, run_id: int, first: int, ids: range) -> int:
            """Every job of ``ids`` through ``link``: sent, run, logged, acknowledged
            (execution ``first`` of the cycle is its job 1)."""
            node_id = link.node_id
            sent_at: dict[int, dt.datetime] = {}
            todo = iter(ids)
            left = len(ids)
            in_flight = 0
            acks: list[int] = []
            logged = 0
            with engine.connect() as conn:
                while left or in_flight:
                    room = min(batch - in_flight, left)
                    if room > 0:
                        now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
                        wire = []
                        for _ in range(room):
                            exec_id = next(todo)
                            sent_at[exec_id] = now
                            wire.append((exec_id, "noop", "{}"))
                        refused = link.send(epoch, wire)
                        if refused:
                            raise SystemExit(f"floor: the agent refused {refused[0]}")
                        left -= room
                        in_flight += room
                    done = link.done(epoch, acks, COLLECT_LIMIT)
                    acks = []
                    if not done:
                        time.sleep(0.001)
                        continue
                    rows = []
                    for exec_id, duration, finished, result in done:
                        ended = epoch0 + dt.timedelta(seconds=finished)
                        rows.append(
                            (exec_id, run_id, exec_id - first + 1, node_id, 1,
                             ExecState.DONE, False, epoch, sent_at.pop(exec_id),
                             ended - dt.timedelta(seconds=duration), ended, duration, result,
                             None)
                        )  # fmt: skip
                    with conn.begin():
                        copy(conn, rows)
                    acks = [row[0] for row in rows]
                    in_flight -= len(rows)
                    logged += len(rows)
                link.ack(epoch, acks)
            return logged

        seconds = []
        with ThreadPoolExecutor(len(links)) as pool:
            for cycle in range(cycles):
                share = -(-jobs // len(links))
                base = FLOOR_FIRST_ID + cycle * jobs
                started = time.perf_counter()
                futures = [
                    pool.submit(
                        one_agent,
                        link,
                        cycle + 1,
                        base,
                        range(base + i * share, min(base + jobs, base + (i + 1) * share)),
                    )
                    for i, link in enumerate(links)
                ]
                logged = sum(f.result() for f in futures)
                seconds.append(time.perf_counter() - started)
                if logged != jobs:
                    raise SystemExit(f"floor: expected {jobs} results, got {logged}")
        for link in links:
            link.close()
        with engine.connect() as conn:
            count = conn.scalar(
                select(func.count()).select_from(Execution).where(Execution.state == ExecState.DONE)
            )
        engine.dispose()
    if count != jobs * cycles:
        raise SystemExit(f"floor: expected {jobs * cycles} committed results, {count} logged")
    return {"seconds": seconds, "jobs_per_s": [jobs / s for s in seconds]}


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


def _peer_module(name: str, source: str) -> str:
    """Write a peer's app module ``name`` (``source`` on :data:`REDIS`) into a fresh
    folder on ``sys.path`` (its workers import it from there); the folder."""
    import tempfile

    tmp = tempfile.mkdtemp()
    with open(os.path.join(tmp, f"{name}.py"), "w") as fh:
        fh.write(source.format(redis=REDIS))
    sys.path.insert(0, tmp)
    return tmp


@contextlib.contextmanager
def _workers(folder: str, *module_args: str) -> Iterator[None]:
    """A peer's worker processes: ``python -m MODULE_ARGS`` in ``folder``, where
    :func:`_peer_module` wrote the app module (on their path); stopped on the way out."""
    worker = subprocess.Popen(
        [sys.executable, "-m", *module_args],
        cwd=folder,
        env={**os.environ, "PYTHONPATH": folder},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        worker.terminate()
        try:
            worker.wait(10)
        except subprocess.TimeoutExpired:
            worker.kill()


def run_celery(jobs: int, workers: int) -> dict[str, float] | str:
    """The same no-op tasks through Celery + Redis; why not when Celery or Redis is missing."""
    try:
        import redis  # noqa: F401
        from celery import group  # noqa: F401
    except ImportError:
        return "skipped: celery not installed (pip install '.[bench]')"
    tmp = _peer_module("benchapp", CELERY_APP)
    import benchapp  # type: ignore[import-not-found]

    try:
        benchapp.app.backend.client.ping()
    except Exception:  # noqa: BLE001 - Redis not running: no peer figures
        return f"skipped: redis not answering on {REDIS}"
    benchapp.app.backend.client.flushdb()
    with _workers(
        tmp,
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
    ):
        benchapp.noop.delay().get(timeout=60)  # worker is up
        started = time.perf_counter()
        results = [benchapp.noop.delay() for _ in range(jobs)]
        for result in results:
            result.get(timeout=300)
        seconds = time.perf_counter() - started
    return {"seconds": seconds, "jobs_per_s": jobs / seconds}


DRAMATIQ_APP = """
import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

broker = RedisBroker(url="redis://{redis}/13")
broker.add_middleware(Results(backend=RedisBackend(url="redis://{redis}/13"), result_ttl=600_000))
dramatiq.set_broker(broker)

@dramatiq.actor(store_results=True, max_retries=0)
def noop():
    return None
"""


#: Worker threads per Dramatiq process (Dramatiq's default).
DRAMATIQ_THREADS = 8


def run_dramatiq(jobs: int, workers: int, threads: int) -> dict[str, float] | str:
    """The same no-op tasks through Dramatiq + Redis (results stored there and read back,
    as Celery's are); why not when Dramatiq or Redis is missing."""
    try:
        import dramatiq  # noqa: F401
        import redis  # noqa: F401
    except ImportError:
        return "skipped: dramatiq not installed (pip install '.[bench]')"
    tmp = _peer_module("dramatiqapp", DRAMATIQ_APP)
    import dramatiqapp  # type: ignore[import-not-found]

    client = dramatiqapp.broker.client
    try:
        client.ping()
    except Exception:  # noqa: BLE001 - Redis not running: no peer figures
        return f"skipped: redis not answering on {REDIS}"
    client.flushdb()
    with _workers(
        tmp,
        "dramatiq",
        "dramatiqapp",
        "--processes",
        str(workers),
        "--threads",
        str(threads),
        "--worker-shutdown-timeout",
        "5000",
        "--skip-logging",
    ):
        dramatiqapp.noop.send().get_result(block=True, timeout=60_000)  # workers are up
        started = time.perf_counter()
        messages = [dramatiqapp.noop.send() for _ in range(jobs)]
        for message in messages:
            message.get_result(block=True, timeout=300_000)
        seconds = time.perf_counter() - started
    client.flushdb()
    return {"seconds": seconds, "jobs_per_s": jobs / seconds}


def peer(
    name: str, jobs: int, run: Callable[[], dict[str, float] | str], figures: dict[str, Any]
) -> float | None:
    """Run a peer (unless ``jobs`` is 0), print its line, return its tasks/s.

    A peer that cannot run is skipped with a printed note, and ``figures[name]``
    says why, so a missing peer never passes for a broken one."""
    got = run() if jobs else f"skipped: --{name}-jobs 0"
    if isinstance(got, str):
        print(f"{name}: {got}")
        figures[name] = got
        return None
    print(f"{name}: {jobs} tasks in {got['seconds']:.2f}s = {got['jobs_per_s']:.0f} tasks/s")
    return float(got["jobs_per_s"])


def celery_peer(jobs: int, workers: int, figures: dict[str, Any]) -> float | None:
    """The Celery peer with ``workers`` prefork processes (see :func:`peer`)."""
    return peer("celery", jobs, lambda: run_celery(jobs, workers), figures)


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
        "later ones run them where they were learned (0: only the adding is measured, "
        "no floor and no peers)",
    )
    parser.add_argument(
        "--db-url",
        default=os.environ.get("JODL_TEST_DATABASE_URL", DEFAULT_PG),
        help="server for a fresh database (PostgreSQL) or sqlite:// for SQLite",
    )
    parser.add_argument(
        "--floor-jobs",
        type=int,
        default=None,
        help="no-op jobs through the floor, a bare loop over the same agents "
        "(default: --jobs; 0 to skip it)",
    )
    parser.add_argument(
        "--cli-jobs",
        type=int,
        default=None,
        help="jobs added by `jodl jobs add --from FILE` to a fresh database "
        "(default: --jobs; 0 to skip it)",
    )
    parser.add_argument(
        "--celery-jobs",
        type=int,
        default=10_000,
        help="no-op tasks through Celery (0 to skip the peer)",
    )
    parser.add_argument(
        "--dramatiq-jobs",
        type=int,
        default=10_000,
        help="no-op tasks through Dramatiq (0 to skip the peer)",
    )
    parser.add_argument(
        "--dramatiq-threads",
        type=int,
        default=DRAMATIQ_THREADS,
        help="worker threads in each Dramatiq process (its processes: --agents, as Celery's)",
    )
    args = parser.parse_args()
    # No cycle, no floor to compare it with: --cycles 0 measures the adding alone.
    floor_jobs = args.jobs if args.floor_jobs is None else args.floor_jobs
    floor_jobs = floor_jobs if args.cycles else 0
    cli_jobs = args.jobs if args.cli_jobs is None else args.cli_jobs

    with agents(args.agents, slots=args.slots) as addresses:
        jodl = run_jodl(args.db_url, args.jobs, addresses, args.slots, args.cycles)
        floor = (
            run_floor(args.db_url, floor_jobs, addresses, args.cycles, jodl["epoch"])
            if floor_jobs
            else None
        )
    for i, (secs, rate) in enumerate(zip(jodl["seconds"], jodl["jobs_per_s"], strict=True), 1):
        print(
            f"jodl cycle {i}: {args.jobs} jobs in {secs:.2f}s = {rate:.0f} jobs/s "
            f"({secs / args.jobs * 1e6:.1f} us/job)"
        )
    print(f"(adding the jobs took {jodl['add_seconds']:.2f}s)")
    cli_seconds = run_cli_add(args.db_url, cli_jobs) if cli_jobs else None
    if cli_seconds is not None:
        print(f"jodl jobs add --from: {cli_jobs} jobs in {cli_seconds:.2f}s")
    figures: dict[str, Any] = {
        "jobs": args.jobs,
        "agents": args.agents,
        "db": "sqlite" if args.db_url.startswith("sqlite") else "postgresql",
        "add_jobs_per_s": round(args.jobs / jodl["add_seconds"]),
        "cli_add_jobs_per_s": round(cli_jobs / cli_seconds) if cli_seconds else "skipped",
    }
    if not args.cycles:
        figures["jobs_per_s"] = "skipped: --cycles 0"
        print(json.dumps(figures))
        return
    figures["jobs_per_s"] = round(max(jodl["jobs_per_s"]))
    figures["first_cycle_jobs_per_s"] = round(jodl["jobs_per_s"][0])
    figures["cycles_jobs_per_s"] = [round(r) for r in jodl["jobs_per_s"]]
    figures["us_per_job"] = round(min(jodl["us_per_job"]), 1)
    if floor is None:
        print("floor: skipped: --floor-jobs 0")
        figures["floor"] = "skipped: --floor-jobs 0"
    else:
        for i, (secs, rate) in enumerate(zip(floor["seconds"], floor["jobs_per_s"], strict=True)):
            print(f"floor cycle {i + 1}: {floor_jobs} jobs in {secs:.2f}s = {rate:.0f} jobs/s")
        figures["floor_jobs_per_s"] = round(max(floor["jobs_per_s"]))
        figures["ratio_floor"] = round(figures["jobs_per_s"] / max(floor["jobs_per_s"]), 2)
    celery = celery_peer(args.celery_jobs, args.agents, figures)
    if celery is not None:
        figures["celery_jobs_per_s"] = round(celery)
        figures["ratio"] = round(figures["jobs_per_s"] / celery, 2)
    dramatiq = peer(
        "dramatiq",
        args.dramatiq_jobs,
        lambda: run_dramatiq(args.dramatiq_jobs, args.agents, args.dramatiq_threads),
        figures,
    )
    if dramatiq is not None:
        figures["dramatiq_jobs_per_s"] = round(dramatiq)
        figures["ratio_dramatiq"] = round(figures["jobs_per_s"] / dramatiq, 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
