"""``jodl up`` as a user runs it: one command, a URL and a login, results, Ctrl-C stops all.

Started as a subprocess in an empty directory (SQLite file there), it must
migrate, create the operator, start two agents, serve the UI, answer a
submitted URL of the local test site, restart an agent that dies, and on
SIGINT stop every child process and mark the agents' nodes removed.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from agents import child_env, jodl_command, port_answers, run_jodl, wait_for
from sqlalchemy import create_engine, text
from webserver import AGENT_ENV, EventStream

from crawler_app.notify import mail
from crawler_app.settings import AppSettings
from web.settings import up_app_url

if TYPE_CHECKING:
    from tests.site import TestSite

pytest_plugins = ("tests.site",)

UP_LINE = re.compile(r"^JODL is up: (http://\S+)$", re.M)
READY_LINE = re.compile(r"^Press Ctrl-C to stop", re.M)
LOGIN_LINE = re.compile(r"operator login: (\S+), password in (\S+) \(readable only by you\)$", re.M)


def metric_names(text: str) -> set[str]:
    """The metric families of a Prometheus text page."""
    from prometheus_client.parser import text_string_to_metric_families

    return {family.name for family in text_string_to_metric_families(text)}


def children(pid: int) -> list[int]:
    """Child process ids of ``pid`` (Linux /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except FileNotFoundError:
            continue
    return found


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie does not count)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def start_up(cwd: Path, log: Path, extra: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    # No JODL_SECRET: `jodl up` generates one for its master and agents.
    env = child_env(
        {**AGENT_ENV, "JODL_LOG_LEVEL": "WARNING", "JODL_SECRET": None, **(extra or {})}
    )
    with open(log, "wb") as out:
        return subprocess.Popen(
            [*jodl_command(), "up", "--listen", "127.0.0.1:0"],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def wait_up(proc: subprocess.Popen[bytes], log: Path) -> str:
    def ready() -> str | None:
        if proc.poll() is not None:
            raise AssertionError(f"jodl up exited ({proc.returncode}):\n{log.read_text()}")
        return log.read_text()

    wait_for(lambda: READY_LINE.search(ready() or ""), timeout=60, what="jodl up to be ready")
    return log.read_text()


def test_up_runs_everything_and_stops_everything(tmp_path: Path, site: TestSite) -> None:
    site.set_page("/hello", "<title>Hello</title><p>hello from the site</p>")
    log = tmp_path / "up.log"
    proc = start_up(tmp_path, log)
    try:
        out = wait_up(proc, log)
        url = UP_LINE.search(out).group(1)  # type: ignore[union-attr]
        email, login_file = LOGIN_LINE.search(out).groups()  # type: ignore[union-attr]
        # The password is in a file only its owner reads, not on the terminal.
        assert Path(login_file).stat().st_mode & 0o777 == 0o600
        file_email, password = Path(login_file).read_text().split()
        assert email == file_email == "admin@localhost" and len(password) >= 12
        assert password not in out
        assert (tmp_path / "jodl.db").exists()
        agents = children(proc.pid)
        assert len(agents) == 2 and all(alive(p) for p in agents)

        # A URL of the local site, through the API and the stream.
        # (as the operator: private networks of the allowlist serve signed-in users only)
        r = httpx.post(
            url + "api/batches",
            json={"urls": [site.url("/hello")]},
            auth=(email, password),
            timeout=30,
        )
        assert r.status_code == 201
        with EventStream(url.rstrip("/") + r.json()["events"]) as stream:
            events = list(stream)
        result = events[0].json()
        assert [e.event for e in events] == ["result", "complete"]
        assert result["ok"] and result["title"] == "Hello"
        assert result["excerpt"] == "hello from the site"

        # The operator login works; both agents are active nodes.
        status = httpx.get(url + "api/admin/status", auth=(email, password), timeout=30)
        assert status.status_code == 200
        assert sorted(n["state"] for n in status.json()["nodes"]) == ["active", "active"]

        # Every process serves /metrics on a port of its own (the master's too), and
        # Prometheus's service discovery lists all three.
        def targets() -> list[dict[str, Any]] | None:
            found = httpx.get(
                url + "api/admin/prometheus/targets", auth=(email, password), timeout=30
            ).json()
            jobs = sorted(group["labels"]["job"] for group in found)
            return found if jobs == ["jodl-agent", "jodl-agent", "jodl-master"] else None

        groups: Any = wait_for(targets, timeout=60, what="every process in the discovery")
        addresses = [group["targets"][0] for group in groups]
        assert len(set(addresses)) == 3, addresses
        for group in groups:
            names = metric_names(httpx.get(f"http://{group['targets'][0]}/metrics").text)
            wanted = "jodl_agent_slots" if group["labels"]["job"] == "jodl-agent" else "jodl_nodes"
            assert wanted in names, (group, sorted(names)[:20])

        # An agent that dies is started again on its port.
        victim = agents[0]
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: (
                len([p for p in children(proc.pid) if alive(p)]) == 2
                and victim not in children(proc.pid)
            ),
            timeout=30,
            what="the dead agent to be replaced",
        )
        ports = [n["address"].rsplit(":", 1)[1] for n in status.json()["nodes"]]
        wait_for(lambda: all(port_answers(int(p)) for p in ports), timeout=30, what="ports")
        agents = children(proc.pid)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert proc.returncode == 0, log.read_text()
    assert "JODL stopped." in log.read_text()
    assert not [p for p in agents if alive(p)]
    engine = create_engine(f"sqlite:///{tmp_path / 'jodl.db'}")
    with engine.connect() as conn:
        states = [row[0] for row in conn.execute(text("SELECT state FROM jodl_node"))]
    engine.dispose()
    assert states == ["removed", "removed"]

    # Started again on the same database: the operator exists and its login is shown
    # again; the agents come back as the same nodes; SIGTERM stops it too.
    log.write_bytes(b"")
    proc = start_up(tmp_path, log)
    try:
        out = wait_up(proc, log)
        assert f"operator login: {email}, password in {login_file} " in out
        assert Path(login_file).read_text().split() == [email, password], "the same login"
        assert out.rstrip().splitlines()[-2].startswith("  database:"), "the login comes last"
        login = subprocess.run(
            [*jodl_command(), "up", "--print-login"],
            cwd=tmp_path,
            env=child_env({}),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert login.returncode == 0 and f"{email}, password in {login_file}" in login.stdout
        assert password not in login.stdout
        agents = children(proc.pid)
        engine = create_engine(f"sqlite:///{tmp_path / 'jodl.db'}")
        with engine.connect() as conn:
            states = [row[0] for row in conn.execute(text("SELECT state FROM jodl_node"))]
        engine.dispose()
        assert states == ["active", "active"], "no removed nodes left behind by a restart"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert proc.returncode == 0, log.read_text()
    assert not [p for p in agents if alive(p)]


def test_up_and_config_never_print_the_database_password(pg_database: str, tmp_path: Path) -> None:
    """Issue 20: the password inside JODL_DATABASE_URL stays off the terminal."""
    # The test server trusts loopback: the password is carried, not checked.
    url = pg_database.replace("postgres@", "postgres:hunter2-secret@", 1)
    assert "hunter2-secret" in url
    config = run_jodl("config", env={"JODL_DATABASE_URL": url})
    assert config.returncode == 0, config.stderr
    assert "hunter2-secret" not in config.stdout + config.stderr
    assert "postgres:***@" in config.stdout
    log = tmp_path / "up.log"
    proc = start_up(tmp_path, log, {"JODL_DATABASE_URL": url})
    try:
        out = wait_up(proc, log)
        assert "  database: " + url.replace("hunter2-secret", "***") in out
        again = run_jodl("up", "--print-login", cwd=tmp_path)
        assert "postgres:***@" in again.stdout
        # A second one on the same database refuses, naming it without the password.
        second = run_jodl("up", "--listen", "127.0.0.1:0", env={"JODL_DATABASE_URL": url})
        assert second.returncode == 1 and "already running on" in second.stderr
        for text_shown in (second.stdout + second.stderr, again.stdout + again.stderr):
            assert "hunter2-secret" not in text_shown
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert "hunter2-secret" not in log.read_text()


def test_up_links_the_digests_to_the_url_it_serves(tmp_path: Path) -> None:
    """Issue 24: the digests built under ``jodl up`` link to the web UI it serves."""
    served = "http://127.0.0.1:41234/"
    value = up_app_url(served, env={})
    assert value == served
    # What the master's cycle scheduler reads once `jodl up` set it, and the digest it builds.
    app = AppSettings.from_env(env={"JODL_APP_URL": value})
    item = mail.ChangedPage(
        "https://example.org/news", "News", None, dt.datetime(2026, 1, 2), "+ new", page_id=7
    )
    _subject, text, html = mail.render(mail.Digest("ann@example.org", [item], app.app_url))
    assert "http://127.0.0.1:41234/pages/7" in text and "http://127.0.0.1:41234/pages/7" in html
    assert "Manage your tracked pages: http://127.0.0.1:41234/" in text
    # The operator's own URL holds, from the environment or the config file.
    assert up_app_url(served, env={"JODL_APP_URL": "https://jodl.example.org"}) is None
    config = tmp_path / "jodl.toml"
    config.write_text('app_url = "https://jodl.example.org"\n')
    assert up_app_url(served, env={"JODL_CONFIG": str(config)}) is None
    # Served on every interface: named by this machine's name, never 0.0.0.0.
    wide = up_app_url("http://0.0.0.0:8080/", env={})
    assert wide is not None and "0.0.0.0" not in wide and wide.endswith(":8080/")
