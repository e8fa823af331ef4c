"""Every benchmark runs at a smoke size, so a change that breaks one fails here.

Each ``bench/*.py`` script (helpers such as ``_common.py`` aside) has an entry in
:data:`SMOKE`: arguments that make it finish in seconds. A smoke run must exit 0
and print one JSON object as its last line, as a full run does. Timings are never
asserted: benchmarks are not tests. Peers that cannot run here (Celery without
Redis, pgqueuer not installed) are skipped by the benchmark itself, which says so in
a line and in its JSON; the scripts that need PostgreSQL get the server of
``JODL_TEST_DATABASE_URL`` and are skipped without one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
#: Longest a smoke run may take (seconds): far above what one takes, below CI's limit.
TIMEOUT = 300

#: script -> its smoke arguments.
SMOKE: dict[str, str] = {
    "detection.py": "--smoke",
    "failover.py": "--jobs 300 --kills 1 --ttl 1 --agents 1 --slots 2 --restart-jobs 300",
    "farm.py": "--agents 4 --processes 2 --jobs 300",
    "makespan.py": "--case both --jobs 10 --cycles 2 --seeds 1 --lb 0.1 --speeds 1,2"
    " --hard-agents 4 --hard-jobs 100 --hard-cycles 2 --hard-lb 0.5",
    "ondemand.py": "--jobs 200 --rounds 1 --batch 50 --celery-jobs 20",
    "pagecheck.py": "--pages 20 --latency 0.001 --concurrency 20 --confirm-delay 0.05",
    "scale.py": "--jobs 300 --base-jobs 100 --cycles 2 --agents 1 --slots 2",
    "sse.py": "--urls 10 --jobs 40 --streams 4 --agents 1 --slots 2",
    "throughput.py": "--jobs 200 --cycles 1 --celery-jobs 20 --dramatiq-jobs 20",
}

#: Scripts that need a PostgreSQL server, and the option that names it.
POSTGRES_OPTION = {
    "failover.py": "--database",
    "farm.py": "--db-url",
    "ondemand.py": "--db-url",
    "scale.py": "--db-url",
    "sse.py": "--database-url",
    "throughput.py": "--db-url",
}


def scripts() -> list[str]:
    """The benchmarks: every ``bench/*.py`` but the helpers (leading underscore)."""
    return sorted(p.name for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def run(script: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("JODL_DATABASE_URL", "JODL_SECRET")}
    return subprocess.run(
        [sys.executable, str(BENCH / script), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        stdin=subprocess.DEVNULL,
    )


def test_every_benchmark_has_a_smoke_entry() -> None:
    found = scripts()
    assert len(found) >= 7, "the benchmarks were found"
    assert sorted(SMOKE) == found, "bench/ and SMOKE differ: give each new benchmark smoke args"
    assert set(POSTGRES_OPTION) <= set(SMOKE)


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_benchmark_runs_at_smoke_size(script: str) -> None:
    args = SMOKE[script].split()
    if script in POSTGRES_OPTION:
        url = os.environ.get("JODL_TEST_DATABASE_URL")
        if not url:
            pytest.skip("needs PostgreSQL: set JODL_TEST_DATABASE_URL")
        args += [POSTGRES_OPTION[script], url]
    done = run(script, args)
    tail = f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, tail
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    assert lines, tail
    figures = json.loads(lines[-1])
    assert isinstance(figures, dict) and figures, tail


@pytest.mark.parametrize("script", sorted(SMOKE))
def test_benchmark_answers_help(script: str) -> None:
    done = run(script, ["--help"])
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
