"""Operating JODL: health and metrics of every process, the dashboard, profiles, live status.

Real processes: agents are ``jodl agent`` subprocesses with their ops endpoint on a
free port; the master runs here with its endpoint on another; the web app is
scraped through its test client.
"""

from __future__ import annotations

import json
import pstats
import re
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from agents import TEST_SECRET, free_port, run_jodl, wait_for
from prometheus_client.parser import text_string_to_metric_families
from test_security import closed_by_peer, threads_of

from jodl import Settings
from jodl.agent.keys import ops_token
from jodl.cli.ops import render, snapshot
from jodl.master import Master
from jodl.ops.server import MAX_CONNECTIONS, serve_master

pytest_plugins = ("tests.site",)

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana-dashboard.json"


def scrape(text: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample name -> {sorted labels: value}, and every family's name (no samples needed)."""
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(text):
        out.setdefault(family.name, {})
        if family.type == "counter":  # declared, labelled, no series yet: still a known name
            out.setdefault(family.name + "_total", {})
        for sample in family.samples:
            out.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return out


def get_metrics(address: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    return scrape(httpx.get(f"http://{address}/metrics", timeout=10).text)


def value(metrics: dict[str, Any], name: str, **labels: str) -> float:
    return metrics.get(name, {}).get(tuple(sorted(labels.items())), 0.0)


@pytest.fixture
def master_ops(settings):
    """A master (not started) with its ops endpoint on a free loopback port."""
    master = Master(settings.replace(metrics_listen=f"127.0.0.1:{free_port()}", profiling=True))
    server = serve_master(master)
    assert server is not None
    yield master, server.address
    server.close()
    master.close()


def test_every_process_serves_health_and_metrics(store, agents, master_ops, tmp_path) -> None:
    master, address = master_ops
    agent_ops = f"127.0.0.1:{free_port()}"
    (agent,) = agents(1, slots=2, env={"JODL_AGENT_METRICS_LISTEN": agent_ops})
    wait_for(lambda: _answers(agent_ops), what="the agent's ops endpoint")
    fam = store.ensure_family("noop")
    store.add_jobs(fam, ((f"k{i}", "{}") for i in range(200)))

    assert httpx.get(f"http://{address}/healthz").json()["role"] == "master"
    assert httpx.get(f"http://{address}/readyz").status_code == 503  # no lease yet
    before = get_metrics(address)
    summary = master.run_cycle("noop")
    assert summary.done == 200
    assert httpx.get(f"http://{address}/readyz").status_code == 200
    after = get_metrics(address)

    for name in ("jodl_jobs_dispatched_total", "jodl_jobs_done_total"):
        moved = value(after, name, family="noop") - value(before, name, family="noop")
        assert moved >= 200, name
    assert value(after, "jodl_master_loop_step_seconds_count") > value(
        before, "jodl_master_loop_step_seconds_count"
    )
    assert value(after, "jodl_log_writer_commit_seconds_count") > value(
        before, "jodl_log_writer_commit_seconds_count"
    )
    assert value(after, "jodl_node_slots", node=agent.address) == 2
    assert value(after, "jodl_node_up", node=agent.address) == 1
    assert value(after, "jodl_node_round_trip_seconds", node=agent.address) > 0
    assert value(after, "jodl_run_jobs_total", family="noop") == 200
    assert value(after, "jodl_run_jobs_done", family="noop") == 200
    assert value(after, "jodl_runs_running") == 0
    assert value(after, "jodl_nodes", state="active") == 1

    agent_metrics = get_metrics(agent_ops)
    assert value(agent_metrics, "jodl_agent_jobs_finished_total", outcome="done") >= 200
    assert value(agent_metrics, "jodl_agent_slots") == 2
    assert httpx.get(f"http://{agent_ops}/healthz").json()["role"] == "agent"


def _answers(address: str) -> bool:
    try:
        return httpx.get(f"http://{address}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_failures_retries_and_dead_jobs_are_counted(store, agents, master_ops) -> None:
    master, address = master_ops
    agents(1, slots=2)
    fam = store.ensure_family("fail", max_attempts=2)
    store.add_jobs(fam, ((f"k{i}", "{}") for i in range(5)))
    before = get_metrics(address)
    summary = master.run_cycle("fail")
    assert summary.dead == 5
    after = get_metrics(address)

    def moved(name: str) -> float:
        return value(after, name, family="fail") - value(before, name, family="fail")

    assert moved("jodl_jobs_dead_total") == 5
    assert moved("jodl_jobs_retried_total") == 5  # one retry each, then dead
    assert moved("jodl_jobs_failed_total") == 10


def web_metrics(tmp_path: Path) -> dict[str, Any]:
    from test_web_api import make_app

    client = make_app(tmp_path).test_client()
    client.post("/api/batches", json={"urls": ["http://a.example/"]})
    text = client.get("/metrics").get_data(as_text=True)
    return scrape(text)


def test_web_metrics_are_prometheus_clients(tmp_path) -> None:
    metrics = web_metrics(tmp_path)
    assert value(metrics, "jodl_web_batches_total") == 1
    assert value(metrics, "jodl_web_urls_total", answer="queued") == 1
    assert value(metrics, "jodl_queue_jobs", family="check_page", state="queued") == 1
    assert value(metrics, "jodl_web_requests_total", code="2xx") >= 1


def dashboard_metrics() -> set[str]:
    board = json.loads(DASHBOARD.read_text())
    names: set[str] = set()
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            names.update(re.findall(r"\bjodl_[a-z_]+", target["expr"]))
    return names


def test_dashboard_queries_only_metrics_that_exist(store, agents, master_ops, tmp_path) -> None:
    master, address = master_ops
    agent_ops = f"127.0.0.1:{free_port()}"
    agents(1, slots=2, env={"JODL_AGENT_METRICS_LISTEN": agent_ops})
    wait_for(lambda: _answers(agent_ops), what="the agent's ops endpoint")
    store.add_jobs(store.ensure_family("noop"), [("k", "{}")])
    master.run_cycle("noop")
    live = set(get_metrics(address)) | set(get_metrics(agent_ops)) | set(web_metrics(tmp_path))
    wanted = dashboard_metrics()
    assert len(wanted) >= 15
    assert sorted(wanted - live) == []


def test_profile_of_a_live_master(store, agents, master_ops, tmp_path, db_url) -> None:
    master, address = master_ops
    agents(1, slots=4)
    # About 12 s of work: the profile (a command that takes seconds to start on a loaded
    # machine) is taken while the loop runs.
    jobs = 1000
    sleeps = ((f"k{i}", '{"seconds": 0.05}') for i in range(jobs))
    store.add_jobs(store.ensure_family("sleep"), sleeps)
    result: dict[str, Any] = {}
    cycle = threading.Thread(target=lambda: result.update(s=master.run_cycle("sleep")))
    cycle.start()
    wait_for(lambda: master.runs, what="the cycle to open")
    out = tmp_path / "master.pstats"
    try:
        done = run_jodl("profile", "master", address, "--seconds", "1", "-o", str(out))
    finally:
        cycle.join(timeout=120)
    assert done.returncode == 0, done.stderr
    stats = pstats.Stats(str(out))
    functions = {name for _, _, name in stats.stats}  # type: ignore[attr-defined]
    # the master's loop, profiled from another thread
    assert "Master.step" in functions, sorted(functions)[:50]
    assert result["s"].done == jobs
    wrong = run_jodl("profile", "agent", address, "--seconds", "1")
    assert wrong.returncode == 1 and "not a agent" in wrong.stderr


def test_profile_needs_the_ops_token_never_the_secret(store, settings, tmp_path) -> None:
    secret = "s3cret-token-of-enough-length"
    master = Master(
        settings.replace(metrics_listen=f"127.0.0.1:{free_port()}", secret=secret, profiling=True)
    )
    server = serve_master(master)
    assert server is not None
    try:
        url = f"http://{server.address}/debug/profile?seconds=0.2"
        assert httpx.get(url).status_code == 401
        # The cluster secret is no ops credential: it never has to go over HTTP.
        assert httpx.get(url, headers={"Authorization": f"Bearer {secret}"}).status_code == 401
        token = ops_token(Settings(secret=secret))
        ok = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert ok.status_code == 200 and ok.content
        # Another cluster's `jodl profile` (the test session's secret): the endpoint
        # cannot prove it holds that cluster's token, so nothing is sent.
        refused = run_jodl("profile", "master", server.address, "--seconds", "0.2")
        assert refused.returncode == 1 and "did not prove" in refused.stderr
        out = str(tmp_path / "p.pstats")
        done = run_jodl(
            "profile",
            "master",
            server.address,
            "--seconds",
            "0.2",
            "-o",
            out,
            env={"JODL_SECRET": secret},
        )
        assert done.returncode == 0, done.stderr
    finally:
        server.close()
        master.close()


def test_profiling_is_off_unless_asked_for(store, settings) -> None:
    master = Master(settings.replace(metrics_listen=f"127.0.0.1:{free_port()}"))
    server = serve_master(master)
    assert server is not None
    try:
        token = ops_token(settings)
        answer = httpx.get(
            f"http://{server.address}/debug/profile?seconds=0.2",
            headers={"Authorization": f"Bearer {token}"},
        )
        assert answer.status_code == 404 and "JODL_PROFILING" in answer.json()["error"]
    finally:
        server.close()
        master.close()


class Squatter:
    """A local user's process that bound an ops port first: it answers every request
    as an ops endpoint would (it cannot know the token) and records every byte sent."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.received = bytearray()
        self.requests = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                request = b""
                while b"\r\n\r\n" not in request:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    request += chunk
                self.received += request
                self.requests += 1
                if b"/metrics" in request.split(b"\r\n", 1)[0]:
                    body = b'jodl_node_slots_busy{node="127.0.0.1:1"} 3.0\n'
                else:
                    body = json.dumps(
                        {"status": "ok", "role": "master", "reason": "ok", "proof": "0" * 64}
                    ).encode()
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
                    % len(body)
                    + body
                )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.listener.close()


@pytest.fixture
def squatter():
    squatting = Squatter()
    yield squatting
    squatting.close()


def test_no_credential_goes_to_a_process_squatting_the_ops_port(store, settings, squatter) -> None:
    done = run_jodl("profile", "master", squatter.address, "--seconds", "0.2")
    assert done.returncode == 1
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "did not prove" in done.stderr and "nothing was sent" in done.stderr
    # The live view trusts no numbers from it either.
    assert snapshot(store, settings.replace(metrics_listen=squatter.address)).live == {}
    assert squatter.requests >= 2, "the squatter was asked to prove itself"
    seen = bytes(squatter.received)
    assert TEST_SECRET.encode() not in seen
    assert ops_token(settings).encode() not in seen
    assert b"authorization" not in seen.lower()


@pytest.mark.parametrize("role", ["master", "agent"])
def test_a_taken_ops_port_stops_a_profiling_process_at_start(tmp_path, squatter, role) -> None:
    url = f"sqlite:///{tmp_path / 'ops.db'}"
    if role == "master":
        assert run_jodl("db", "upgrade", env={"JODL_DATABASE_URL": url}).returncode == 0
        argv: tuple[str, ...] = ("master",)
        env = {"JODL_DATABASE_URL": url, "JODL_METRICS_LISTEN": squatter.address}
    else:
        argv = ("agent", "--listen", f"127.0.0.1:{free_port()}")
        env = {"JODL_AGENT_METRICS_LISTEN": squatter.address}
    done = run_jodl(*argv, env={**env, "JODL_PROFILING": "1"}, timeout=60)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and squatter.address in last and "taken" in last, last


def test_idle_connections_neither_pile_up_threads_nor_stay(spawn_agent) -> None:
    """Issue 20: 300 connections that never send a request to an agent's ops endpoint."""
    address = f"127.0.0.1:{free_port()}"
    agent = spawn_agent(env={"JODL_AGENT_METRICS_LISTEN": address})
    wait_for(lambda: _answers(address), what="the agent's ops endpoint")
    idle_threads = threads_of(agent.pid)
    host, port = address.split(":")
    peers = [socket.create_connection((host, int(port)), timeout=10) for _ in range(300)]
    for peer in peers:
        peer.setblocking(False)  # looked at, never waited on
    try:
        peak = 0
        closed: set[int] = set()

        def all_closed() -> bool:
            nonlocal peak
            peak = max(peak, threads_of(agent.pid))
            closed.update(i for i, peer in enumerate(peers) if closed_by_peer(peer))
            return len(closed) == len(peers)

        # Those beyond the cap at once, the others after the read timeout.
        wait_for(all_closed, timeout=60, what="the endpoint to close every idle connection")
        assert peak <= idle_threads + MAX_CONNECTIONS, (peak, idle_threads)
    finally:
        for peer in peers:
            peer.close()
    assert _answers(address)
    wait_for(lambda: threads_of(agent.pid) <= idle_threads, what="the threads to end")


def test_status_shows_a_running_runs_progress(store, agents, settings) -> None:
    agents(1, slots=2)
    jobs = 80
    store.add_jobs(
        store.ensure_family("sleep"), ((f"k{i}", '{"seconds": 0.05}') for i in range(jobs))
    )
    master = Master(settings)
    result: dict[str, Any] = {}
    cycle = threading.Thread(target=lambda: result.update(s=master.run_cycle("sleep")))
    cycle.start()
    try:

        def in_progress() -> Any:
            snap = snapshot(store, settings.replace(metrics_listen=None))
            running = [r for r in snap.data["runs"] if r["state"] == "running"]
            if running and 0 < running[0]["jobs_done"] < jobs:
                return snap, running[0]
            return None

        snap, run = wait_for(in_progress, timeout=60, what="a running run's progress")
        assert run["jobs_total"] == jobs
        from rich.console import Console

        console = Console(record=True, width=160)
        console.print(render(snap))
        text = console.export_text()
        assert f"{run['jobs_done']}/{jobs}" in text
        assert "sleep#1" in text
    finally:
        cycle.join(timeout=120)
        master.close()
    assert result["s"].done == jobs


def test_page_checks_count_fetches_and_politeness_waits(store, agents, settings, site) -> None:
    from app_support import agent_env

    agent_ops = f"127.0.0.1:{free_port()}"
    env = {
        **agent_env(),
        "JODL_FETCH_HOST_INTERVAL": "0.05",
        "JODL_AGENT_METRICS_LISTEN": agent_ops,
    }
    agents(1, slots=2, env=env)
    wait_for(lambda: _answers(agent_ops), what="the agent's ops endpoint")
    pages = 6
    for i in range(pages):
        site.set_page(f"/p{i}", f"<html><title>P{i}</title><body>page {i}</body></html>")
    fam = store.ensure_family("check_page")
    # The site is on loopback: jobs of a user allowed the allowlist (crawler_app.fetching.reach).
    store.add_jobs(
        fam,
        (
            (f"p{i}", json.dumps({"url": site.url(f"/p{i}"), "reach": "allowlist"}))
            for i in range(pages)
        ),
    )
    master = Master(settings)
    try:
        assert master.run_cycle("check_page").done == pages
    finally:
        master.close()
    metrics = get_metrics(agent_ops)
    assert value(metrics, "jodl_fetches_total", outcome="ok") == pages
    # six fetches of one host, 50 ms apart: all but the first waited their turn
    assert value(metrics, "jodl_politeness_waits_total") >= 1
    assert value(metrics, "jodl_politeness_wait_seconds_total") > 0
