"""Failover of the master: leader kills at random moments of a cycle, with two standbys.

Starts three ``jodl master`` processes on a fresh PostgreSQL database (one leads,
two stand by) and K agents, asks for a cycle of N ``mark`` jobs (each appends a
line to a file when it really runs: the ground truth), and SIGKILLs the leader at
random moments of the cycle, starting a new standby after each kill (``--signal
STOP`` freezes it instead, killed once the others took over: its process still
exists, so its lease must expire, as for a master on another host). For each
kill it measures the time from the kill to the new leader's first dispatch (a
dispatch row with a newer epoch) and to its lease (the election alone); at the
end it counts the jobs that ran again after their result was committed (must be
0).

Then a restart: a single master on a run of ``--restart-jobs`` mark jobs is killed
once it has dispatched some, and started again (as a service manager does); the
time from that process's start to its first dispatch, and the jobs it ran again
after their result was committed (must be 0). The last line printed is one JSON
object with the figures of both.

    python bench/failover.py --jobs 20000 --kills 10 --ttl 5
    python bench/failover.py --kills 10 --ttl 1 --restart-jobs 100000
    python bench/failover.py --signal STOP --restart-jobs 0
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import DEFAULT_PG, SECRET, agents, fresh_database, stop_all  # noqa: E402


def start_master(db_url: str, ttl: float, log_dir: Path, n: int) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "JODL_DATABASE_URL": db_url,
        "JODL_SECRET": SECRET,
        "JODL_LEASE_TTL": str(ttl),
        "JODL_METRICS_LISTEN": "",
        "JODL_LOG_LEVEL": "WARNING",
    }
    with open(log_dir / f"master{n}.log", "wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "jodl", "master"], env=env, stdout=out, stderr=out
        )


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


@contextmanager
def mark_cycle(
    url: str, jobs: int, agent_count: int, slots: int, seconds: float, prefix: str
) -> Iterator[tuple[str, Any, Path, Path]]:
    """A fresh database with ``jobs`` mark jobs of ``seconds`` each and running agents:
    (database URL, store, folder of the masters' logs, the marks file)."""
    from jodl import Store, make_engine
    from jodl.log.migrate import upgrade

    log_dir = Path(tempfile.mkdtemp(prefix=prefix))
    marks = log_dir / "marks.txt"
    with fresh_database(url) as db_url, agents(agent_count, slots=slots) as addresses:
        engine = make_engine(db_url)
        try:
            upgrade(engine)
            store = Store(engine)
            for address in addresses:
                store.add_node(address, slots=slots)
            family = store.ensure_family("mark")
            store.add_jobs(
                family,
                (
                    (f"m{i}", json.dumps({"key": f"m{i}", "path": str(marks), "seconds": seconds}))
                    for i in range(jobs)
                ),
            )
            yield db_url, store, log_dir, marks
        finally:
            engine.dispose()


def committed_keys(engine: Any) -> set[str]:
    """Keys of the jobs with a committed result."""
    from sqlalchemy import select

    from jodl.log import ExecState, Execution, Job

    with engine.connect() as conn:
        return set(
            conn.scalars(
                select(Job.key)
                .join(Execution, Execution.job_id == Job.id)
                .where(Execution.state == ExecState.DONE)
            )
        )


def marked(marks: Path) -> Counter[str]:
    """How often each job ran (its marks); none when no job ran (a run ended before)."""
    if not marks.exists():
        return Counter()
    return Counter(line.split(" ")[1] for line in marks.read_text().splitlines())


def rerun_after(ran: Counter[str], committed: set[str]) -> int:
    """Jobs that ran more than once (marks) although a result of theirs was committed."""
    return sum(1 for key, n in ran.items() if n > 1 and key in committed)


def reap(masters: list[subprocess.Popen[bytes]], pid: int) -> None:
    """Wait for the killed master ``pid``, as a service manager does (no zombie)."""
    for proc in masters:
        if proc.pid == pid:
            proc.wait()


def run(
    url: str,
    jobs: int,
    kills: int,
    ttl: float,
    agent_count: int,
    slots: int,
    seconds: float,
    how: signal.Signals = signal.SIGKILL,
) -> dict[str, Any]:
    from sqlalchemy import func, select

    from jodl.log import Dispatch, MasterLease

    with mark_cycle(url, jobs, agent_count, slots, seconds, "jodl-failover-") as (
        db_url,
        store,
        log_dir,
        marks,
    ):
        engine = store.engine

        def lease() -> tuple[str, int] | None:
            """The newest held lease (the family's, or the whole database's)."""
            with engine.connect() as conn:
                row = conn.execute(
                    select(MasterLease.holder, MasterLease.epoch)
                    .where(MasterLease.holder != "")
                    .order_by(MasterLease.epoch.desc())
                    .limit(1)
                ).first()
            return None if row is None else (row[0], row[1])

        masters = [start_master(db_url, ttl, log_dir, n) for n in range(3)]
        started = len(masters)
        failovers: list[float] = []
        #: seconds from a kill to the new leader's lease (before it resumes the run)
        elections: list[float] = []
        committed_at_kill: set[str] = set()
        try:
            while lease() is None:
                time.sleep(0.05)
            request = store.request_run("mark")
            for _ in range(kills):
                time.sleep(random.uniform(0.5, 2.0))
                row = store.run_request(request)
                if row is not None and row.finished_at is not None:
                    break  # the cycle ended before this kill: more jobs needed
                while (held := lease()) is None:  # a family handed over is briefly free
                    time.sleep(0.01)
                holder, epoch = held
                pid = int(holder.split(":")[1])
                os.kill(pid, how)
                killed = time.monotonic()
                if how == signal.SIGKILL:
                    reap(masters, pid)
                committed_at_kill |= committed_keys(engine)
                elected = None
                while True:
                    if elected is None and (lease() or ("", epoch))[1] > epoch:
                        elected = time.monotonic() - killed
                    with engine.connect() as conn:
                        newer = conn.scalar(
                            select(func.count()).where(Dispatch.epoch > epoch).limit(1)
                        )
                    row = store.run_request(request)
                    if newer or (row is not None and row.finished_at is not None):
                        break
                    time.sleep(0.01)
                if newer:
                    failovers.append(time.monotonic() - killed)
                if how == signal.SIGSTOP:  # frozen until the others took over: now gone
                    os.kill(pid, signal.SIGKILL)
                    reap(masters, pid)
                if elected is not None:
                    elections.append(elected)
                masters.append(start_master(db_url, ttl, log_dir, started))
                started += 1
            while True:
                row = store.run_request(request)
                if row is not None and row.finished_at is not None:
                    break
                time.sleep(0.1)
        finally:
            stop_all(masters)
    ran = marked(marks)
    return {
        "jobs": jobs,
        "ttl_s": ttl,
        "signal": how.name,
        "kills": len(failovers),
        "failover_median_s": round(statistics.median(failovers), 3) if failovers else None,
        "failover_p95_s": round(percentile(failovers, 0.95), 3) if failovers else None,
        "failover_max_s": round(max(failovers), 3) if failovers else None,
        "election_median_s": round(statistics.median(elections), 3) if elections else None,
        "election_max_s": round(max(elections), 3) if elections else None,
        "rerun_after_commit": rerun_after(ran, committed_at_kill),
        "jobs_marked": len(ran),
        "run_error": row.error if row is not None else None,
    }


def restart(url: str, jobs: int, ttl: float, agent_count: int, slots: int) -> dict[str, Any]:
    """A single master killed during a run of ``jobs`` and started again at once."""
    from sqlalchemy import func, select

    from jodl.log import Dispatch, ExecState, Execution

    with mark_cycle(url, jobs, agent_count, slots, 0.002, "jodl-restart-") as (
        db_url,
        store,
        log_dir,
        marks,
    ):
        engine = store.engine

        def done_count() -> int:
            with engine.connect() as conn:
                return int(
                    conn.scalar(select(func.count()).where(Execution.state == ExecState.DONE)) or 0
                )

        def newest_epoch() -> int:
            with engine.connect() as conn:
                return int(conn.scalar(select(func.max(Dispatch.epoch))) or 0)

        first = start_master(db_url, ttl, log_dir, 0)
        second: subprocess.Popen[bytes] | None = None
        try:
            request = store.request_run("mark")
            # Killed after a few seconds of work: enough results committed and
            # dispatches open that the restarted master has something to resume.
            deadline = time.monotonic() + 120
            while done_count() < min(jobs // 10, 5000) and time.monotonic() < deadline:
                time.sleep(0.05)
            first.kill()
            first.wait()
            epoch = newest_epoch()
            committed = committed_keys(engine)
            started = time.monotonic()
            second = start_master(db_url, ttl, log_dir, 1)
            dispatched = None
            while time.monotonic() - started < 120:
                if newest_epoch() > epoch:
                    dispatched = time.monotonic() - started
                    break
                row = store.run_request(request)
                if row is not None and row.finished_at is not None:
                    break  # a small run ended without a new dispatch: nothing to time
                time.sleep(0.005)
            time.sleep(2.0)  # let it run on: a job rerun after its commit shows in the marks
            row = store.run_request(request)
        finally:
            stop_all([p for p in (first, second) if p is not None])
    ran = marked(marks)
    return {
        "restart_jobs": jobs,
        "restart_done_at_kill": len(committed),
        "restart_first_dispatch_s": None if dispatched is None else round(dispatched, 3),
        "restart_rerun_after_commit": rerun_after(ran, committed),
        "restart_run_error": row.error if row is not None else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20_000, help="mark jobs in the cycle")
    parser.add_argument("--kills", type=int, default=10, help="leader kills")
    parser.add_argument(
        "--signal",
        choices=("KILL", "STOP"),
        default="KILL",
        help="KILL: the leader dies (a dead master of this host is seen at once); STOP: it "
        "hangs, as a master on another host that died would look (its lease must expire)",
    )
    parser.add_argument("--ttl", type=float, default=5.0, help="JODL_LEASE_TTL (seconds)")
    parser.add_argument(
        "--job-seconds",
        type=float,
        default=0.01,
        help="each job's work in the failover cycle (long enough a cycle for the kills)",
    )
    parser.add_argument("--agents", type=int, default=2, help="agent processes")
    parser.add_argument("--slots", type=int, default=4, help="slots per agent")
    parser.add_argument("--database", default=os.environ.get("JODL_BENCH_DATABASE_URL", DEFAULT_PG))
    parser.add_argument(
        "--restart-jobs", type=int, default=100_000, help="jobs of the restart run (0: none)"
    )
    args = parser.parse_args()
    figures = run(
        args.database,
        args.jobs,
        args.kills,
        args.ttl,
        args.agents,
        args.slots,
        args.job_seconds,
        signal.Signals[f"SIG{args.signal}"],
    )
    if args.restart_jobs:
        figures |= restart(args.database, args.restart_jobs, args.ttl, args.agents, args.slots)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
