"""On a terminal, ``jodl run``'s progress bar and log lines never share a line."""

from __future__ import annotations

import os
import pty
import select
import subprocess
from typing import TYPE_CHECKING

from agents import child_env, jodl_command, run_jodl
from webserver import AGENT_ENV

if TYPE_CHECKING:
    from tests.site import TestSite  # noqa: F401

pytest_plugins = ("tests.site",)


def run_in_terminal(args: list[str], env: dict[str, str], timeout: float = 60) -> str:
    """Run ``jodl ARGS`` with a pseudo-terminal as stdout and stderr; all it wrote."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [*jodl_command(), *args],
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        env=child_env({**env, "COLUMNS": "120"}),
    )
    os.close(follower)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], timeout)
            if not ready:
                raise AssertionError(f"no output for {timeout:.0f}s: {out[-500:]!r}")
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: the program ended
                break
            if not chunk:
                break
            out += chunk
    finally:
        proc.wait(timeout=timeout)
        os.close(leader)
    assert proc.returncode == 0, out.decode(errors="replace")
    return out.decode(errors="replace")


def test_log_lines_are_printed_above_the_bar(store, db_url, agents):
    store.add_jobs(store.ensure_family("sleep"), {f"k{i}": {"seconds": 0.05} for i in range(20)})
    agents(1)
    store.add_node("127.0.0.1:1")  # unreachable: the master logs a warning during the run
    out = run_in_terminal(["run", "sleep"], {"JODL_DATABASE_URL": db_url})
    warnings = out.count("WARNING jodl.master")
    assert warnings >= 1, out
    # Each log line starts on a cleared line of its own, not after a drawn bar.
    for part in out.split("WARNING jodl.master")[:-1]:
        line_start = part.rsplit("\r", 1)[-1]
        assert line_start.startswith("\x1b[2K") and "━" not in line_start, repr(line_start)
    assert "[progress.description]" not in out
    assert out.count("run sleep#1: 20/20 done") == 1, "the summary once"


def test_a_cycle_ends_on_its_summary_not_on_a_stale_count(store, db_url, agents, site):
    site.set_page("/a", "<title>A</title><p>a</p>")
    env = {"JODL_DATABASE_URL": db_url, **AGENT_ENV}
    agents(1, env=AGENT_ENV)
    assert run_jodl("users", "add", "bob@example.org", env=env).returncode == 0
    assert run_jodl("track", site.url("/a"), "--user", "bob@example.org", env=env).returncode == 0
    out = run_in_terminal(["cycle"], env)
    last_frame = out.rsplit("\x1b[2K", 1)[-1]  # what stays on the screen above the summary
    assert "finish" not in last_frame and "0/1" not in last_frame, repr(last_frame)
    assert "1/1 pages checked" in out
