"""The README's walk-through with real processes: ``jodl up``, the CLI beside it, a second up.

``jodl up`` runs in its own empty folder on free ports; the CLI commands run in
the same folder as a user types them. They must see ``jodl up``'s data, hand a
cycle to its master instead of killing it, and a second ``jodl up`` must say
that one runs and exit, while the first keeps serving.
"""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
from agents import child_env, jodl_command
from test_web_up import LOGIN_LINE, UP_LINE, start_up, wait_up
from webserver import AGENT_ENV

if TYPE_CHECKING:
    from tests.site import TestSite

pytest_plugins = ("tests.site",)

#: The page checker's cycle beside ``jodl up``: no schedule, checks not spread.
CLI_ENV = {**AGENT_ENV, "JODL_SCHEDULE": "off", "JODL_CHECK_SPREAD": "0"}


def jodl(cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*jodl_command(), *args],
        cwd=cwd,
        env=child_env(CLI_ENV),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_read_in_an_empty_folder_creates_no_database(tmp_path: Path) -> None:
    out = jodl(tmp_path, "status")
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "error: no database at jodl.db: run `jodl db upgrade` or `jodl up` to create it "
        "(or set JODL_DATABASE_URL)"
    ]
    assert not (tmp_path / "jodl.db").exists()


def test_the_cli_works_beside_jodl_up(tmp_path: Path, site: TestSite) -> None:
    site.set_page("/news", "<title>News</title><p>first</p>")
    log = tmp_path / "up.log"
    proc = start_up(tmp_path, log, CLI_ENV)
    second = None
    try:
        out = wait_up(proc, log)
        url = UP_LINE.search(out).group(1)  # type: ignore[union-attr]
        email, _password = LOGIN_LINE.search(out).groups()  # type: ignore[union-attr]

        # The CLI sees jodl up's data (the same database by default).
        status = jodl(tmp_path, "status")
        assert status.returncode == 0, status.stderr
        assert status.stdout.count(" active ") == 2, status.stdout
        admins = jodl(tmp_path, "admins", "list")
        assert admins.stdout.split() == [email]

        # A cycle asked beside the running master is run by it, followed here.
        assert jodl(tmp_path, "users", "add", "alice@example.org").returncode == 0
        tracked = jodl(tmp_path, "track", site.url("/news"), "--user", "alice@example.org")
        assert tracked.returncode == 0, tracked.stderr
        cycle = jodl(tmp_path, "cycle")
        assert cycle.returncode == 0, cycle.stderr
        assert "the cycle is asked of it" in cycle.stderr
        assert "1/1 pages checked" in cycle.stdout
        assert "(resumed)" not in cycle.stdout

        # A change is mailed: the digest lands in jodl up's local mail sink.
        site.set_page("/news", "<title>News</title><p>second, quite different</p>")
        for _ in range(3):
            changed = jodl(tmp_path, "cycle")
            assert changed.returncode == 0, changed.stderr
            if list((tmp_path / "jodl-mail").glob("*.eml")):
                break
        (digest,) = (tmp_path / "jodl-mail").glob("*.eml")
        assert b"alice@example.org" in digest.read_bytes()
        assert "1/1 digests sent" in changed.stdout, changed.stdout

        # `jodl run` beside it asks its master for the run instead of fencing it.
        assert jodl(tmp_path, "jobs", "add", "noop", "--count", "3").returncode == 0
        run = jodl(tmp_path, "run", "noop")
        assert run.returncode == 0, run.stderr
        assert "the run is asked of it" in run.stderr
        assert run.stdout.splitlines()[-1].startswith("run noop#1: 3/3 done"), run.stdout
        unknown = jodl(tmp_path, "run", "nosuch")
        assert unknown.returncode == 1 and "no family 'nosuch'" in unknown.stderr

        # A second jodl up in the same folder says what runs and exits.
        second = subprocess.run(
            [*jodl_command(), "up", "--listen", "127.0.0.1:0"],
            cwd=tmp_path,
            env=child_env(CLI_ENV),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert second.returncode == 1
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and "already running" in lines[0] and url in lines[0], lines

        # The first one still serves and its master still works.
        assert proc.poll() is None, log.read_text()
        assert httpx.get(url, timeout=30).status_code == 200
        again = jodl(tmp_path, "cycle")
        assert again.returncode == 0 and "1/1 pages checked" in again.stdout, again.stderr
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert proc.returncode == 0, log.read_text()
    assert "Traceback" not in log.read_text()
