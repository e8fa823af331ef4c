"""Progress from inside a job (``jodl.progress``): a real agent's long jobs say how far
they are; the master relays it to the log about once a second; ``jodl status`` and the
run's page and API show it while they run, and it goes when the run ends."""

from __future__ import annotations

import base64
import re
import threading
from typing import Any

from agents import run_jodl, wait_for
from flask.testing import FlaskClient
from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker

from crawler_app.users.pages import add_user
from jodl.log import Store
from jodl.log.models import JobProgress
from jodl.master import Master
from jodl.settings.config import Settings
from web.app import create_app
from web.settings import WebSettings

OPS = {"Authorization": "Basic " + base64.b64encode(b"ops@example.org:correct horse").decode()}


def web_client(store: Store, db_url: str) -> FlaskClient:
    """The web UI on the test's database, an operator logged in (for the HTML page)."""
    with sessionmaker(store.engine).begin() as s:
        add_user(s, "ops@example.org", "correct horse").is_admin = True
    settings = WebSettings(database_url=db_url, web_secure_cookies=False)
    client = create_app(settings, engine=store.engine).test_client()
    form = client.get("/login").get_data(as_text=True)
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', form)
    assert csrf is not None
    login = {"email": "ops@example.org", "password": "correct horse", "csrf_token": csrf[1]}
    assert client.post("/login", data=login).status_code == 303
    return client


def test_long_jobs_report_progress_while_they_run(
    store: Store, settings: Settings, agents: Any, db_url: str
) -> None:
    agents(1, slots=2)
    # 20 steps of a second: what is checked below takes seconds on a loaded machine, and
    # the jobs must still run when it is.
    store.add_jobs(
        store.ensure_family("steps"), {f"s{i}": {"steps": 20, "seconds": 1.0} for i in range(2)}
    )
    client = web_client(store, db_url)  # logged in before the jobs start
    master = Master(settings, store=store)
    summary: list[Any] = []
    runner = threading.Thread(target=lambda: summary.append(master.run_cycle("steps")))
    runner.start()
    try:
        wait_for(lambda: store.running_run("steps") is not None, 30, "the run to open")
        run = store.running_run("steps")
        assert run is not None
        wait_for(
            lambda: (
                {j.key for j in store.reads.running_jobs(run.id) if j.done >= 2} == {"s0", "s1"}
            ),
            30,
            "both jobs' reports of their third step",
        )
        reports = {j.key: j for j in store.reads.running_jobs(run.id)}
        assert all(j.total == 20 and j.note.startswith("step ") for j in reports.values())
        assert all(j.address for j in reports.values())
        # The run's page and its API, as an operator sees them.
        api = client.get(f"/api/admin/runs/{run.id}/jobs", headers=OPS).get_json()
        assert {j["key"] for j in api["running"]} == {"s0", "s1"}
        page = client.get(f"/admin/runs/{run.id}", headers=OPS).get_data(as_text=True)
        assert 'id="running"' in page and "<progress max=" in page
        status = run_jodl("status", env={"JODL_DATABASE_URL": db_url})
        assert status.returncode == 0, status.stderr
        assert "s0: " in status.stdout and "/20 (" in status.stdout
    finally:
        runner.join(120)
        master.close()
    assert summary and summary[0].done == 2
    # The run ended: its reports went with it.
    assert store.reads.running_jobs(summary[0].run_id) == []
    with store.session() as s:
        assert s.scalar(select(func.count()).select_from(JobProgress)) == 0
