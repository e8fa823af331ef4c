"""A throwaway PostgreSQL cluster for tests that restart or stop their server.

Such a test must never touch the machine's own server (other clients, other
sessions' tests): it creates a cluster of its own with ``initdb`` in a temporary
folder, starts it with ``pg_ctl`` on a free loopback port (its socket in that folder
too), restarts that one, and stops and removes it at the end.

The cluster favours speed over durability (``fsync``, ``synchronous_commit`` and
``full_page_writes`` off): nothing in it outlives the test, and a restart by
``pg_ctl -m fast`` shuts down cleanly, so no crash recovery needs the WAL anyway.

PostgreSQL refuses to run as root; as root the server's commands run as the
``postgres`` system user (who owns the folder), otherwise as the current user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agents import free_port

#: Seconds ``initdb`` or a start/stop/restart of the cluster may take.
COMMAND_TIMEOUT = 120.0
#: The system user the server runs as when the tests run as root.
SERVER_USER = "postgres"
#: Settings of the throwaway server: fast (nothing needs to survive a crash of it) and
#: small (it shares the machine with the tests' own processes).
FAST_SETTINGS = {
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "shared_buffers": "32MB",
    "max_connections": "100",
    "listen_addresses": "'127.0.0.1'",
}


class ClusterUnavailable(RuntimeError):
    """This machine cannot run a throwaway cluster (the message says why)."""


def server_bin_dir() -> Path:
    """The newest PostgreSQL server's binaries (``initdb``, ``pg_ctl``)."""
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version, reverse=True):
        if os.access(Path(candidate) / "initdb", os.X_OK):
            return Path(candidate)
    on_path = shutil.which("initdb")
    if on_path and shutil.which("pg_ctl"):
        return Path(on_path).parent
    raise ClusterUnavailable(
        "no PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql/*/bin "
        "or on PATH: install the postgresql package"
    )


def _version(path: str) -> float:
    try:
        return float(Path(path).parent.name)
    except ValueError:
        return 0.0


@dataclass
class ThrowawayCluster:
    """One PostgreSQL cluster in ``folder`` listening on 127.0.0.1:``port``."""

    folder: Path
    port: int
    bin_dir: Path
    user: str | None  # the system user commands run as (None: this process's own)

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def log(self) -> Path:
        return self.folder / "server.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    @classmethod
    def create(cls) -> ThrowawayCluster:
        """initdb a new cluster in a fresh temporary folder and start it."""
        bin_dir = server_bin_dir()
        user = SERVER_USER if os.geteuid() == 0 else None
        folder = Path(tempfile.mkdtemp(prefix="jodl-pg-"))
        if user is not None:
            try:
                entry = pwd.getpwnam(user)
            except KeyError:
                shutil.rmtree(folder, ignore_errors=True)
                raise ClusterUnavailable(
                    f"running as root and no '{user}' system user to run PostgreSQL as"
                ) from None
            os.chown(folder, entry.pw_uid, entry.pw_gid)
        cluster = cls(folder=folder, port=free_port(), bin_dir=bin_dir, user=user)
        try:
            cluster._run(
                "initdb", "-D", str(cluster.data), "-U", "postgres", "--auth=trust",
                "-E", "UTF8", "--no-sync", "--no-instructions",
            )  # fmt: skip
            with open(cluster.data / "postgresql.conf", "a", encoding="utf-8") as conf:
                conf.write("\n# throwaway cluster of a test (tests/pg_cluster.py)\n")
                for key, value in {**FAST_SETTINGS, "port": str(cluster.port)}.items():
                    conf.write(f"{key} = {value}\n")
                conf.write(f"unix_socket_directories = '{folder}'\n")
            cluster.start()
        except BaseException:
            cluster.remove()
            raise
        return cluster

    def start(self) -> None:
        self._pg_ctl("start", "-l", str(self.log))

    def restart(self) -> None:
        """Restart the server: every connection ends (``-m fast``), as in a real restart."""
        self._pg_ctl("restart", "-m", "fast", "-l", str(self.log))

    def stop(self) -> None:
        self._pg_ctl("stop", "-m", "immediate")

    def remove(self) -> None:
        """Stop the server if it runs and delete its folder."""
        if (self.data / "postmaster.pid").exists():
            try:
                self.stop()
            except ClusterUnavailable:
                pass
        shutil.rmtree(self.folder, ignore_errors=True)

    def _pg_ctl(self, action: str, *args: str) -> None:
        wait = ("-w", "-t", str(int(COMMAND_TIMEOUT)))
        self._run("pg_ctl", "-D", str(self.data), *wait, action, *args, what=f"pg_ctl {action}")

    def _run(self, program: str, *args: str, what: str = "") -> None:
        argv = [str(self.bin_dir / program), *args]
        if self.user is not None:
            argv = ["runuser", "-u", self.user, "--", *argv]
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, cwd=self.folder
        )
        if done.returncode != 0:
            tail = ""
            if self.log.exists():
                tail = "\n" + self.log.read_text(errors="replace")[-2000:]
            raise ClusterUnavailable(
                f"{what or program} failed: {(done.stderr or done.stdout).strip()}{tail}"
            )


def cluster_for_tests() -> Iterator[ThrowawayCluster]:
    """A throwaway cluster for a test module's fixture: skipped without PostgreSQL tests
    (``JODL_TEST_DATABASE_URL`` unset), a failure when this machine cannot run one,
    removed at the end."""
    import pytest

    if not os.environ.get("JODL_TEST_DATABASE_URL", "").strip():
        pytest.skip("JODL_TEST_DATABASE_URL is not set: PostgreSQL tests skipped (CI sets it)")
    try:
        made = ThrowawayCluster.create()
    except ClusterUnavailable as exc:
        pytest.fail(f"no throwaway PostgreSQL cluster: {exc}")
    try:
        yield made
    finally:
        made.remove()
