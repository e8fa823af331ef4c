"""Live figures everywhere (issue 24, item 7): each process its own ops port, Prometheus
service discovery of every live master and agent, a "last seen" that moves, and a live
status that reads the right master and refuses another cluster's.

Real processes: ``jodl agent`` and ``jodl master`` subprocesses with their ops endpoints
on port 0 (the system picks), a second cluster on a database of its own, the web app on
the test's database through its test client.
"""

from __future__ import annotations

import base64
import threading
from pathlib import Path
from typing import Any

import httpx
from agents import free_port, run_jodl, spawn_jodl, wait_for
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import sessionmaker

from crawler_app.users.pages import add_user
from jodl.cli.ops import render, snapshot
from jodl.log import Store
from jodl.log.nodes import OPS_LABEL
from jodl.settings.config import Settings
from web.app import create_app
from web.settings import WebSettings

PASSWORD = "correct horse battery"
OPS = {"Authorization": "Basic " + base64.b64encode(f"ops@x.org:{PASSWORD}".encode()).decode()}
USER = {"Authorization": "Basic " + base64.b64encode(f"user@x.org:{PASSWORD}".encode()).decode()}
#: Port 0: the system picks a free port for each process.
ANY_PORT = "127.0.0.1:0"


def metric_names(address: str) -> set[str]:
    text = httpx.get(f"http://{address}/metrics", timeout=10).text
    return {family.name for family in text_string_to_metric_families(text)}


def web_client(store: Store, db_url: str) -> Any:
    """The web app on the test's database, with an operator and a plain user."""
    with sessionmaker(store.engine).begin() as s:
        add_user(s, "ops@x.org", PASSWORD).is_admin = True
        add_user(s, "user@x.org", PASSWORD)
    settings = WebSettings(database_url=db_url, web_secure_cookies=False)
    return create_app(settings, engine=store.engine).test_client()


def start_master(db_url: str, tmp_path: Path, listen: str = ANY_PORT, name: str = "master") -> Any:
    env = {"JODL_DATABASE_URL": db_url, "JODL_METRICS_LISTEN": listen}
    return spawn_jodl("master", log_path=tmp_path / f"{name}.log", env=env)


def stop(proc: Any) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except Exception:  # noqa: BLE001 - killed instead
            proc.kill()
            proc.wait(timeout=30)


def live_master_ops(store: Store) -> str | None:
    rows = [m for m in store.masters.masters() if m.live and m.ops]
    return rows[0].ops if rows else None


def node_ops(store: Store) -> dict[str, str]:
    return {n.address: n.labels[OPS_LABEL] for n in store.nodes() if OPS_LABEL in (n.labels or {})}


def test_each_process_has_its_own_ops_port_and_discovery_lists_them_all(
    store: Store, agents: Any, db_url: str, tmp_path: Path
) -> None:
    nodes = agents(2, slots=2, env={"JODL_AGENT_METRICS_LISTEN": ANY_PORT})
    store.ensure_family("noop")  # a master that leads no family calls no agent
    master = start_master(db_url, tmp_path)
    try:
        client = web_client(store, db_url)
        url = "/api/admin/prometheus/targets"

        def listed() -> list[dict[str, Any]] | None:
            groups = client.get(url, headers=OPS).get_json()
            jobs = sorted(g["labels"]["job"] for g in groups)
            return groups if jobs == ["jodl-agent", "jodl-agent", "jodl-master"] else None

        try:
            groups: Any = wait_for(listed, timeout=60, what="the processes to be listed")
        except AssertionError:
            shown = client.get(url, headers=OPS).get_json()
            log = (tmp_path / "master.log").read_text()
            raise AssertionError(f"listed: {shown}\nmaster:\n{log}") from None
        by_node = {g["labels"]["jodl_node"]: g["targets"] for g in groups}
        (master_row,) = [m for m in store.masters.masters() if m.live]
        assert set(by_node) == {a.address for a in nodes} | {master_row.name}
        agent_targets = [by_node[a.address][0] for a in nodes]
        assert len(set(agent_targets)) == 2, "two agents, two ops ports"
        assert by_node[master_row.name] == [master_row.ops]
        for target in [t for ts in by_node.values() for t in ts]:
            assert not target.endswith(":0")
        # The listed URLs answer, with the metrics of the process they name.
        for address in agent_targets:
            assert "jodl_agent_slots" in metric_names(address)
        assert "jodl_master_loop_step_seconds" in metric_names(master_row.ops)
        # Shared state: operators only.
        assert client.get(url).status_code == 401
        assert client.get(url, headers=USER).status_code == 403
        # `jodl node list` shows where each agent serves its metrics.
        shown = run_jodl("node", "list", env={"JODL_DATABASE_URL": db_url})
        assert shown.returncode == 0, shown.stderr
        for address in agent_targets:
            assert f"ops={address}" in shown.stdout
    finally:
        stop(master)


def test_live_status_reads_the_master_the_database_names_and_last_seen_moves(
    store: Store, agents: Any, settings: Settings, db_url: str, tmp_path: Path
) -> None:
    (node,) = agents(1, slots=2, env={"JODL_AGENT_METRICS_LISTEN": ANY_PORT})
    # About 10 s of work on 2 slots: longer than LastSeen.PERIOD after the connect.
    jobs = 40
    store.add_jobs(
        store.ensure_family("sleep"), ((f"k{i}", '{"seconds": 0.5}') for i in range(jobs))
    )
    master = start_master(db_url, tmp_path)
    done: dict[str, Any] = {}
    try:
        wait_for(lambda: live_master_ops(store), timeout=60, what="the master's ops address")
        cycle = threading.Thread(
            target=lambda: done.update(
                r=run_jodl("run", "sleep", env={"JODL_DATABASE_URL": db_url})
            )
        )
        cycle.start()
        try:

            def seen() -> Any:
                (row,) = [n for n in store.nodes() if n.address == node.address]
                return row.last_seen

            first = wait_for(seen, timeout=60, what="the node to be connected")

            def busy() -> Any:
                # Not JODL_METRICS_LISTEN: the address comes from the master's heartbeat.
                snap = snapshot(store, settings.replace(metrics_listen=None))
                figures = snap.live.get(node.address)
                return snap if figures and figures[0] > 0 else None

            snap: Any = wait_for(busy, timeout=60, what="busy slots from the master's /metrics")
            from rich.console import Console

            console = Console(record=True, width=160)
            console.print(render(snap))
            text = console.export_text()
            assert f"{snap.live[node.address][0]:.0f}/2" in text and "?/2" not in text
            wait_for(lambda: seen() > first, timeout=60, what="last seen to move")
        finally:
            cycle.join(timeout=180)
        assert done["r"].returncode == 0, done["r"].stderr
    finally:
        stop(master)


def test_live_status_refuses_the_master_of_another_cluster(
    store: Store, db_url: str, tmp_path: Path
) -> None:
    # Another cluster: its own database (its own cluster id), the same secret (so the
    # token proof alone would pass), and its master on a port this database names.
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert run_jodl("db", "upgrade", env={"JODL_DATABASE_URL": other}).returncode == 0
    address = f"127.0.0.1:{free_port()}"
    master = start_master(other, tmp_path, listen=address, name="other")
    try:
        wait_for(lambda: _answers(address), timeout=60, what="the other cluster's ops endpoint")
        # A master of this cluster said it served there (it stopped; the port was taken).
        store.masters.heartbeat("gone-master", 60.0, "leader", (), address)
        done = run_jodl("status", "--watch", env={"JODL_DATABASE_URL": db_url}, timeout=60)
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
        assert "another cluster" in done.stderr and address in done.stderr
        assert "slots busy" not in done.stdout, "nothing shown from it"
    finally:
        stop(master)


def _answers(address: str) -> bool:
    try:
        return httpx.get(f"http://{address}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_address_bound_is_published_port_0_or_fixed(store: Store, settings: Settings) -> None:
    from jodl.master import Master
    from jodl.ops.server import serve_master

    fixed = f"127.0.0.1:{free_port()}"
    for wanted in (ANY_PORT, fixed):
        master = Master(settings.replace(metrics_listen=wanted), store=store)
        server = serve_master(master)
        assert server is not None
        try:
            assert server.address == fixed if wanted == fixed else server.address != ANY_PORT
            master.leadership.heartbeat(force=True)
            (row,) = [m for m in store.masters.masters() if m.name == master.name]
            assert row.ops == server.address and row.scopes == ()
            assert _answers(server.address)
        finally:
            server.close()
            master.close()
