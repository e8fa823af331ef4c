"""Shared pieces of the benchmarks: fresh databases, agent subprocesses, free ports."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

from sqlalchemy import create_engine, make_url, text

DEFAULT_PG = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
#: Shared secret of this run's master and agents (agents refuse to start without one).
SECRET = secrets.token_urlsafe(32)
#: Seconds between the two SIGTERMs that stop an agent (the first one's handler runs first).
TERM_AGAIN = 0.3

# The benchmarks' sites listen on loopback, which their agents admit (JODL_FETCH_ALLOW);
# the jobs their users queue, here and in the processes started from here, may use it.
os.environ.setdefault("JODL_FETCH_ALLOW_USERS", "*")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def fresh_database(url: str) -> Iterator[str]:
    """A new empty database on the server of ``url`` (PostgreSQL) or a temp SQLite file."""
    if url.startswith("sqlite"):
        path = f"/tmp/jodl-bench-{uuid.uuid4().hex[:8]}.db"
        try:
            yield f"sqlite:///{path}"
        finally:
            for suffix in ("", "-wal", "-shm"):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path + suffix)
        return
    name = f"jodl_bench_{uuid.uuid4().hex[:8]}"
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def stop_all(procs: list[subprocess.Popen[bytes]], wait: float = 10, twice: bool = False) -> None:
    """SIGTERM to every process still running, SIGKILL to those still there after ``wait``.

    ``twice``: a second SIGTERM shortly after the first, for agents, whose first one
    drains (they wait for a master that is gone) and whose second one stops at once.
    """
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    if twice:
        deadline = time.monotonic() + TERM_AGAIN
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.02)
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
    for proc in procs:
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            proc.kill()


def wait_port(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on port {port}")


@contextlib.contextmanager
def agents(
    count: int,
    slots: int = 2,
    speeds: list[float] | None = None,
    env: dict[str, str] | None = None,
    procs: list[subprocess.Popen[bytes]] | None = None,
) -> Iterator[list[str]]:
    """``count`` agent subprocesses on loopback; yields their addresses.

    ``procs``: a list the processes are put in, in the order of the addresses (for a
    benchmark that kills one of them).
    """
    procs = [] if procs is None else procs
    addresses: list[str] = []
    try:
        for i in range(count):
            port = free_port()
            speed = (speeds or [1.0] * count)[i]
            cmd = [
                sys.executable,
                "-m",
                "jodl",
                "agent",
                "--listen",
                f"127.0.0.1:{port}",
                "--slots",
                str(slots),
                "--speed",
                str(speed),
            ]
            child_env = {**os.environ, "JODL_LOG_LEVEL": "WARNING", "JODL_SECRET": SECRET}
            procs.append(
                subprocess.Popen(
                    cmd,
                    env={**child_env, **(env or {})},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            addresses.append(f"127.0.0.1:{port}")
        # They start together: dozens of them importing at once take a while on few cores.
        for address in addresses:
            wait_port(int(address.rsplit(":", 1)[1]), timeout=20.0 + 2.0 * count)
        yield addresses
    finally:
        stop_all(procs, wait=5, twice=True)
