"""Families the agents serve: a run no agent can run says so at once; agents reload.

A package is "installed" as pip would leave it: a module and a ``*.dist-info``
folder with a ``jodl.families`` entry point, written into a folder on the agents'
``PYTHONPATH`` while they run (the folder is empty when they start, as on an agent
started before the user installed the package).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from agents import run_jodl, spawn_jodl, wait_for
from test_web_views import admin_client, app, login, make_user, token  # noqa: F401 - fixtures

from jodl import family as family_registry
from jodl.agent import AgentCore, AgentLink
from jodl.log import Store

MODULE = "wordcount_fam"
WORDS = {f"text-{i}": {"text": " ".join(["word"] * i)} for i in range(1, 11)}


def install_wordcount(site: Path, version: str = "1") -> None:
    """Install the ``wordcount`` family into ``site`` (module first, then its metadata)."""
    (site / f"{MODULE}.py").write_text(
        "from jodl import Family\n\n\n"
        "class WordCount(Family):\n"
        '    name = "wordcount"\n'
        f'    version = "{version}"\n\n'
        "    def run(self, payload):\n"
        '        return {"words": len(payload["text"].split())}\n'
    )
    info = site / f"{MODULE}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {MODULE.replace('_', '-')}\nVersion: {version}\n"
    )
    (info / "entry_points.txt").write_text(f"[jodl.families]\nwordcount = {MODULE}:WordCount\n")


@pytest.fixture
def site(tmp_path: Path) -> Path:
    folder = tmp_path / "site"
    folder.mkdir()
    return folder


@pytest.fixture
def site_here(site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``site`` on this process's path; the installed families read afresh afterwards."""
    monkeypatch.syspath_prepend(str(site))
    yield site
    monkeypatch.undo()
    sys.modules.pop(MODULE, None)
    family_registry.installed.cache_clear()


def test_a_reload_serves_a_family_installed_since_and_keeps_held_results(site_here):
    core = AgentCore("reloading", slots=1)
    try:
        assert "wordcount" not in core.installed.classes
        core.init("m", 1, "{}")
        core.resume()  # as the master's next call does
        core.send([(1, "noop", "{}")])
        wait_for(lambda: core.remaining()[2] == 1, what="the noop job's result")
        assert core.reload("test") == 0, "nothing installed yet: the same generation"

        install_wordcount(site_here)
        assert core.reload("test") == 1
        assert ("wordcount", "1", False, False) in core.family_list()
        assert [row[0] for row in core.take("done", (), 10)] == [1], "the held result stays"
        core.init("m", 1, "{}")  # as the master does when the generation changed
        core.resume()
        core.send([(2, "wordcount", '{"text": "a b c"}')])
        wait_for(lambda: core.remaining()[2] == 2, what="the wordcount job's result")
        results = {row[0]: row[3] for row in core.take("done", (), 10)}
        assert json.loads(results[2]) == {"words": 3}
    finally:
        core.close()


def test_sighup_makes_the_agent_read_its_families_again(site, spawn_agent, settings):
    agent = spawn_agent(env={"PYTHONPATH": str(site)})
    link = AgentLink(1, agent.address, settings)
    link.open("test", 1)
    try:
        assert "wordcount" not in {f.name for f in link.families()}
        install_wordcount(site)
        os.kill(agent.pid, signal.SIGHUP)
        wait_for(
            lambda: "wordcount" in {f.name for f in link.families()},
            timeout=20,
            what=f"the agent to serve wordcount after SIGHUP\n{agent.log()}",
        )
        assert agent.alive()
        # Said in its log (written once the reload is done: it may follow the answer).
        wait_for(
            lambda: "reloaded its families (SIGHUP): +wordcount 1" in agent.log(),
            timeout=20,
            what=f"the agent to log its reload\n{agent.log()}",
        )
    finally:
        link.close()


def test_a_run_no_agent_serves_says_so_and_runs_once_the_agents_reload(
    store: Store, agents, db_url, site, tmp_path
):
    store.ensure_family("wordcount")
    store.add_jobs("wordcount", WORDS)
    agents(2, slots=2, env={"PYTHONPATH": str(site)})
    env = {"JODL_DATABASE_URL": db_url, "JODL_METRICS_LISTEN": ""}
    master_log, run_log = tmp_path / "master.log", tmp_path / "run.log"
    master = spawn_jodl("master", log_path=master_log, env=env)
    run = None
    try:
        wait_for(lambda: store.running_master() is not None, timeout=30, what="the master")
        run = spawn_jodl("run", "wordcount", log_path=run_log, env=env)
        why = "no agent serves wordcount: installed on 0 of 2 agents"
        wait_for(
            lambda: why in run_log.read_text(),
            timeout=30,
            what=f"`jodl run` to say no agent serves the family\n{run_log.read_text()}",
        )
        assert f"{why}; its jobs wait" in master_log.read_text()
        row = store.running_run("wordcount")
        assert row is not None and row.unserved == why
        assert run.poll() is None, "the jobs wait: the run goes on"

        install_wordcount(site)
        reloaded = run_jodl("node", "reload", env=env, timeout=60)
        assert reloaded.returncode == 0, reloaded.stderr
        lines = reloaded.stdout.splitlines()
        assert len(lines) == 2 and all("reloaded:" in line for line in lines), lines
        assert all("wordcount 1" in line for line in lines), lines

        assert run.wait(timeout=60) == 0, run_log.read_text()
        # The first agent initialised again serves it (the second may follow later).
        assert "run wordcount#1: served again, by " in master_log.read_text()
        assert store.reloads_asked() == {}
    finally:
        for proc in (run, master):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=30)
    results = {job.key: job.result for job in store.results("wordcount")}
    assert results == {key: {"words": i} for i, key in enumerate(WORDS, start=1)}
    assert [r["unserved"] for r in store.reads.overview()["runs"]] == [None]


def test_node_reload_without_a_master_is_relayed_by_the_next_one(store: Store, db_url):
    store.add_node("127.0.0.1:9", slots=1)
    env = {"JODL_DATABASE_URL": db_url}
    done = run_jodl("node", "reload", env=env)
    assert done.returncode == 0, done.stderr
    assert "reload asked of 1 node(s): no master runs now" in done.stdout
    assert len(store.reloads_asked()) == 1
    missing = run_jodl("node", "reload", "127.0.0.1:10", env=env)
    assert missing.returncode == 1
    assert missing.stderr.strip() == "error: no live node '127.0.0.1:10'"


def test_the_web_ui_shows_the_reason_and_asks_for_a_reload(app, admin_client):  # noqa: F811
    store = Store(app.extensions["jodl"].engine)
    store.add_node("127.0.0.1:9", slots=1)
    fam = store.ensure_family("wordcount")
    store.add_jobs("wordcount", {"a": {"text": "x"}})
    run, _ = store.open_run(fam, 1)
    why = "no agent serves wordcount: installed on 0 of 1 agents"
    store.set_run_unserved(run.id, why)

    page = admin_client.get(f"/admin/runs/{run.id}").get_data(as_text=True)
    assert why in page
    status = admin_client.get("/api/admin/status").get_json()
    assert [r["unserved"] for r in status["runs"] if r["id"] == run.id] == [why]
    assert why in admin_client.get("/admin/").get_data(as_text=True)

    r = admin_client.post(
        "/admin/nodes/reload",
        data={"address": "127.0.0.1:9", "csrf_token": token(admin_client, "/admin/")},
    )
    assert r.status_code == 303
    assert len(store.reloads_asked()) == 1
    assert "(reload asked)" in admin_client.get("/admin/").get_data(as_text=True)

    csrf = {"X-CSRF-Token": admin_client.get("/api/session").get_json()["csrf_token"]}
    r = admin_client.post("/api/admin/nodes/reload", json={"address": "127.0.0.1:99"}, headers=csrf)
    assert r.status_code == 404, r.get_data(as_text=True)
    r = admin_client.post("/api/admin/nodes/reload", json={}, headers=csrf)
    assert r.status_code == 202, r.get_data(as_text=True)
    assert "1 node(s)" in r.get_json()["message"]
