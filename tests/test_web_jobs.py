"""Jobs over HTTP: a family's jobs added and its results read by a client in any
language (here Flask's test client), run by a real master on an in-process agent;
jobs queued on demand; tokens scoped to families."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from flask import Flask
from flask.testing import FlaskClient
from test_web_api import OPS, USER, make_app

from jodl.agent.local import start_agent
from jodl.log import Store
from jodl.master import Master
from jodl.queue import Queue
from jodl.settings.config import Settings


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Flask]:
    application = make_app(tmp_path)
    yield application
    application.extensions["jodl"].engine.dispose()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def run_cycle(app: Flask, family: str) -> int:
    """One cycle of ``family`` by a real master on the in-process agent ``local:1``."""
    engine = app.extensions["jodl"].engine
    store = Store(engine)
    settings = Settings.from_env(env={}, database_url=str(engine.url), call_timeout=5.0)
    agent = start_agent(settings.replace(secret=None, agent_slots=2), "local:1")
    store.add_node("local:1", slots=2)
    master = Master(settings.replace(secret=None), store=store)
    try:
        summary = master.run_cycle(family)
    finally:
        master.close()
        agent.close()
    return summary.done


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_jobs_added_over_http_run_and_their_results_are_read_since_a_cursor(
    app: Flask, client: FlaskClient
) -> None:
    jobs = [{"key": f"n{i}", "payload": {"i": i}} for i in range(30)]
    r = client.post("/api/families/noop/jobs", json={"jobs": jobs}, headers=OPS)
    assert r.status_code == 201, r.get_json()
    assert r.get_json() == {"family": "noop", "added": 30, "sent": 30}
    again = client.post("/api/families/noop/jobs", json={"jobs": jobs[:5]}, headers=OPS)
    assert again.get_json()["added"] == 0  # keys it has are kept
    assert run_cycle(app, "noop") == 30
    seen: list[str] = []
    cursor = 0
    while True:
        page = client.get(f"/api/families/noop/results?after={cursor}&limit=12", headers=OPS)
        data = page.get_json()
        if not data["results"]:
            assert data["next"] == cursor  # nothing new: the same cursor
            break
        seen += [row["key"] for row in data["results"]]
        assert all(row["run"] == 1 for row in data["results"])
        cursor = data["next"]
    assert sorted(seen) == sorted(f"n{i}" for i in range(30))
    # A second cycle's results come after the cursor, and only they.
    assert run_cycle(app, "noop") == 30
    fresh = client.get(f"/api/families/noop/results?after={cursor}&limit=500", headers=OPS)
    assert {row["run"] for row in fresh.get_json()["results"]} == {2}


def test_bad_rows_are_refused_whole_with_their_index(app: Flask, client: FlaskClient) -> None:
    def post(body: object, family: str = "noop") -> tuple[int, str]:
        r = client.post(f"/api/families/{family}/jobs", json=body, headers=OPS)
        return r.status_code, str(r.get_json())

    good = {"key": "ok", "payload": {}}
    for body, said in [
        ({"jobs": [good, {"key": "bad", "payload": [1, 2]}]}, "jobs[1].payload"),
        ({"jobs": [good, {"key": ""}]}, "jobs[1].key"),
        ({"jobs": [good, {"key": "x", "extra": 1}]}, "jobs[1]"),
        ({"jobs": []}, "non-empty list"),
        ({"nothing": 1}, "jobs"),
    ]:
        status, answer = post(body)
        assert status == 400 and said in answer, (body, answer)
    status, said = post({"jobs": [good]}, family="nosuch")
    assert status == 400 and "nosuch" in said
    assert Store(app.extensions["jodl"].engine).family("noop") is None  # nothing added


def test_jobs_queued_over_http_are_claimed_and_their_result_read(
    app: Flask, client: FlaskClient
) -> None:
    r = client.post(
        "/api/queue/noop/jobs", json={"jobs": [{"key": "q1", "payload": {"a": 1}}]}, headers=OPS
    )
    assert r.status_code == 201 and r.get_json()["queued"] == 1
    assert client.get("/api/queue/noop/jobs/q1", headers=OPS).get_json()["state"] == "queued"
    queue = Queue(app.extensions["jodl"].engine)
    (job,) = queue.claim(1, families=["noop"])
    assert queue.complete(job.id, job.attempt, {"answer": 42})
    data = client.get("/api/queue/noop/jobs/q1", headers=OPS).get_json()
    assert (data["state"], data["result"]) == ("done", {"answer": 42})
    assert client.get("/api/queue/noop/jobs/nope", headers=OPS).status_code == 404
    bad = client.post(
        "/api/queue/noop/jobs", json={"jobs": [{"key": "q2"}], "delay": -1}, headers=OPS
    )
    assert bad.status_code == 400 and "delay" in str(bad.get_json())


def test_a_token_scoped_to_a_family_reaches_its_jobs_and_nothing_else(
    app: Flask, client: FlaskClient
) -> None:
    r = client.post("/api/tokens", json={"families": ["noop"]}, headers=OPS)
    assert r.status_code == 201 and r.get_json()["families"] == ["noop"]
    scoped = bearer(r.get_json()["token"])
    ok = client.post("/api/families/noop/jobs", json={"jobs": [{"key": "a"}]}, headers=scoped)
    assert ok.status_code == 201
    assert client.get("/api/families/noop/results", headers=scoped).status_code == 200
    other = client.post("/api/families/sleep/jobs", json={"jobs": [{"key": "a"}]}, headers=scoped)
    assert other.status_code == 403
    for path in ("/api/pages", "/api/admin/status", "/api/quota"):
        assert client.get(path, headers=scoped).status_code == 403, path
    assert (
        client.post(
            "/api/batches", json={"urls": ["http://a.example/"]}, headers=scoped
        ).status_code
        == 403
    )
    assert client.post("/api/tokens", json={}, headers=scoped).status_code == 403
    # Users who are not operators neither add jobs nor get tokens for them.
    assert (
        client.post(
            "/api/families/noop/jobs", json={"jobs": [{"key": "b"}]}, headers=USER
        ).status_code
        == 403
    )
    assert client.post("/api/tokens", json={"families": ["noop"]}, headers=USER).status_code == 403
