"""``jodl up --standalone``: the page checker's whole cycle in one process.

Started as a user runs it (a subprocess in an empty directory), it must run the
master, the web UI and an in-process agent with no agent process and no secret;
users track a page of the local site, which changes between cycles asked with
``jodl cycle`` beside it; the digest reaches a real SMTP server; ``jodl status``
and the operator view show the node ``local:1``; Ctrl-C stops it all.
"""

from __future__ import annotations

import datetime as dt
import re
import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
from agents import child_env, jodl_command
from app_support import Inbox, add_users_tracking, inbox
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker
from test_web_up import LOGIN_LINE, UP_LINE, children, wait_up
from webserver import AGENT_ENV

from crawler_app.models import Page
from crawler_app.users.pages import sync_jobs
from jodl.log import Store, make_engine
from jodl.log.models import Node, NodeState
from web.standalone import forget_in_process_nodes

if TYPE_CHECKING:
    from tests.site import TestSite

pytest_plugins = ("tests.site",)
__all__ = ["inbox"]  # the fixture, imported for pytest

CYCLE_LINE = re.compile(
    r"cycle (\d+): (\d+)/(\d+) pages checked .* (\d+) changed, (\d+)/(\d+) digests sent"
)


def page(*paragraphs: str) -> str:
    return "<title>News</title>" + "".join(f"<p>{p}</p>" for p in paragraphs)


def jodl(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*jodl_command(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def cycle(cwd: Path, env: dict[str, str]) -> tuple[int, ...]:
    """``jodl cycle`` beside the running jodl up: (checked, pages, changed, sent, digests)."""
    done = jodl(cwd, env, "cycle")
    assert done.returncode == 0, done.stderr + done.stdout
    found = CYCLE_LINE.search(done.stdout)
    assert found, done.stdout
    return tuple(int(n) for n in found.groups()[1:])


def test_standalone_runs_the_page_checkers_cycle_in_one_process(
    tmp_path: Path, db_url: str, site: TestSite, inbox: Inbox
) -> None:
    site.set_page("/news", page("first story", "second story"))
    news = site.url("/news")
    env = child_env(
        {
            **AGENT_ENV,
            "JODL_SECRET": None,  # one process: nothing listens for agents' calls
            "JODL_DATABASE_URL": db_url,
            "JODL_SMTP_HOST": "127.0.0.1",
            "JODL_SMTP_PORT": str(inbox.port),
            "JODL_MAIL_FROM": "JODL <jodl@example.org>",
            "JODL_CHECK_SPREAD": "0",
            # The due page is checked by the cycle the test asks for, not by a tick
            # that could come first (ticks fall on a daily grid: midnight UTC).
            "JODL_CHECK_TICK": "86400",
        }
    )
    log = tmp_path / "up.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*jodl_command(), "up", "--standalone", "--listen", "127.0.0.1:0"],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    engine = None
    try:
        out_text = wait_up(proc, log)
        assert "standalone: master, web UI and agent local:1 in this process" in out_text
        assert "agents:" not in out_text
        assert children(proc.pid) == [], "no agent process"
        url = UP_LINE.search(out_text).group(1)  # type: ignore[union-attr]
        email, login_file = LOGIN_LINE.search(out_text).groups()  # type: ignore[union-attr]
        password = Path(login_file).read_text().split()[1]

        engine = make_engine(db_url)
        store = Store(engine)
        add_users_tracking(store, news, ["ann@example.org", "bob@example.org"])

        assert cycle(tmp_path, env) == (1, 1, 0, 0, 0)  # the baseline
        baseline = len(site.requests("/news"))
        site.set_page("/news", page("first story", "a brand new story"))
        # A requested cycle checks the pages due: a day passes for the daily page (its
        # last check moves a day back, a controlled clock for its due time).
        with sessionmaker(engine).begin() as s:
            for row in s.scalars(select(Page)):
                assert row.slot_at is not None
                row.slot_at -= dt.timedelta(days=1)
            sync_jobs(s)
        # Seen, confirmed by fetching again within the same check, and mailed.
        assert cycle(tmp_path, env) == (1, 1, 1, 2, 2)
        inbox.wait_count(2)
        assert inbox.per_recipient() == {"ann@example.org": 1, "bob@example.org": 1}
        mail = inbox.to("ann@example.org")[0]
        assert news in mail.text and "+ a brand new story" in mail.text
        confirmed = len(site.requests("/news")) - baseline
        assert 2 <= confirmed <= 5, f"one check (a fetch and its confirmations): {confirmed}"

        # The one node is the in-process agent, and it ran every job of both families.
        with engine.connect() as conn:
            nodes = conn.execute(select(Node.address, Node.state)).all()
        assert nodes == [("local:1", NodeState.ACTIVE)]
        status = jodl(tmp_path, env, "status")
        assert status.returncode == 0, status.stderr
        assert re.search(r"^\s+local:1\s+active", status.stdout, re.M), status.stdout
        seen = httpx.get(url + "api/admin/status", auth=(email, password), timeout=30)
        assert seen.status_code == 200
        assert [(n["address"], n["state"]) for n in seen.json()["nodes"]] == [("local:1", "active")]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert proc.returncode == 0, log.read_text()
    assert "JODL stopped." in log.read_text()
    assert engine is not None
    with engine.connect() as conn:
        assert conn.execute(select(Node.state)).scalars().all() == [NodeState.REMOVED]
    engine.dispose()


def test_standalone_refuses_agents(tmp_path: Path) -> None:
    done = jodl(tmp_path, child_env({}), "up", "--standalone", "--agents", "3")
    assert done.returncode != 0
    assert "--standalone runs none" in done.stderr
    assert not (tmp_path / "jodl.db").exists(), "nothing started"


def test_cluster_mode_forgets_nodes_of_a_killed_standalone_run(store: Store) -> None:
    store.add_node("local:1", slots=4)  # left active: that run never stopped cleanly
    store.add_node("127.0.0.1:7001", slots=4)
    assert forget_in_process_nodes(store) == ["local:1"]
    assert [n.address for n in store.nodes()] == ["127.0.0.1:7001"]
