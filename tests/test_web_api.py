"""The JSON API through Flask's test client: validation, auth, CSRF, rate limit, OpenAPI."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy.orm import sessionmaker

from crawler_app.checking.cycle_requests import claim
from crawler_app.models import Snapshot, compress
from crawler_app.users.pages import add_user
from jodl.log import Store, make_engine
from jodl.log.migrate import upgrade
from jodl.log.models import RequestKind, RunState
from web.app import create_app
from web.settings import WebSettings

PASSWORD = "correct horse battery"


def make_app(tmp_path: Path, **settings: Any) -> Flask:
    url = f"sqlite:///{tmp_path / 'api.db'}"
    engine = make_engine(url)
    upgrade(engine)
    values: dict[str, Any] = {
        "web_secure_cookies": False,
        "web_submit_burst": 1000,
        "web_anonymous_submit": True,
        "web_anonymous_burst": 1000,
        "web_anonymous_batch_max": 100,
    }
    values.update(settings)
    app = create_app(WebSettings(database_url=url, **values), engine=engine)
    sessions = sessionmaker(engine)
    with sessions.begin() as s:
        add_user(s, "user@example.org", PASSWORD)
        add_user(s, "ops@example.org", PASSWORD).is_admin = True
    return app


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Flask]:
    application = make_app(tmp_path)
    yield application
    application.extensions["jodl"].engine.dispose()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def basic(email: str, password: str = PASSWORD) -> dict[str, str]:
    raw = base64.b64encode(f"{email}:{password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


USER = basic("user@example.org")
OPS = basic("ops@example.org")


def test_submit_and_read_a_batch(client: FlaskClient) -> None:
    r = client.post(
        "/api/batches", json={"urls": ["http://a.example/", "mailto:x@y", "http://a.example/"]}
    )
    assert r.status_code == 201
    data = r.get_json()
    assert data["size"] == 2 and data["duplicates"] == 1 and data["queued"] == 1
    assert [i["answer"] for i in data["items"]] == ["queued", "refused"]
    assert r.headers["Location"] == data["self"]
    got = client.get(data["self"]).get_json()
    assert got["complete"] is False and got["pending"] == [0]
    assert [e["position"] for e in got["results"]] == [1]
    assert client.get("/api/batches/nope").status_code == 404


def test_submission_validation(client: FlaskClient) -> None:
    cases: list[tuple[dict[str, Any], int, str]] = [
        (
            {"data": "urls=http://a.example/", "content_type": "application/x-www-form-urlencoded"},
            415,
            "JSON",
        ),
        ({"data": "{not json", "content_type": "application/json"}, 400, "JSON object"),
        ({"json": ["http://a.example/"]}, 400, "JSON object"),
        ({"json": {"urls": "http://a.example/"}}, 400, "list of URL"),
        ({"json": {"urls": []}}, 400, "no URL"),
        ({"json": {"urls": [f"http://a.example/{i}" for i in range(101)]}}, 400, "at most 100"),
        ({"json": {}}, 400, "list of URL"),
        (
            {"data": "[" * 50_000 + "]" * 50_000, "content_type": "application/json"},
            400,
            "JSON object",
        ),
        ({"data": b"\xff\xfe", "content_type": "application/json"}, 400, "JSON object"),
        ({"data": "x" * (2 * 1024 * 1024), "content_type": "application/json"}, 413, ""),
    ]
    for kwargs, status, message in cases:
        r = client.post("/api/batches", **kwargs)
        assert r.status_code == status, (kwargs.get("json"), r.get_data(as_text=True)[:200])
        body = r.get_json()
        assert body is not None and message in body["message"]
    # Items of the wrong type are refused one by one, the rest goes ahead.
    r = client.post("/api/batches", json={"urls": [{"a": 1}, 5, None, "http://a.example/"]})
    assert r.status_code == 201
    assert [i["error"] for i in r.get_json()["items"]] == ["not a string"] * 3 + [None]


def test_rate_limit(tmp_path: Path) -> None:
    app = make_app(tmp_path, web_anonymous_burst=3, web_anonymous_per_minute=1.0)
    client = app.test_client()
    codes = [
        client.post("/api/batches", json={"urls": ["http://a.example/"]}).status_code
        for _ in range(4)
    ]
    assert codes == [201, 201, 201, 429]
    r = client.post("/api/batches", json={"urls": ["http://a.example/"]})
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert r.get_json()["error"] == "too_many_requests"
    # Another client (address) has its own bucket.
    other = client.post(
        "/api/batches",
        json={"urls": ["http://a.example/"]},
        environ_base={"REMOTE_ADDR": "10.9.9.9"},
    )
    assert other.status_code == 201
    metrics = client.get("/metrics").get_data(as_text=True)
    assert re.search(r"^jodl_web_rate_limited_total 2.0$", metrics, re.M)


def test_failed_logins_are_limited(tmp_path: Path) -> None:
    app = make_app(tmp_path, web_submit_burst=2, web_submit_per_minute=1.0)
    client = app.test_client()
    wrong = basic("user@example.org", "wrong password")
    assert [client.get("/api/pages", headers=wrong).status_code for _ in range(3)] == [
        401,
        401,
        429,
    ]
    # The right password is refused too while the address is locked: no guessing around it.
    assert client.get("/api/pages", headers=USER).status_code == 429


def test_session_auth_needs_csrf_header_basic_does_not(client: FlaskClient) -> None:
    assert client.post("/api/reset", json={"urls": ["http://a.example/"]}).status_code == 401
    r = client.post("/api/session", json={"email": "user@example.org", "password": PASSWORD})
    assert r.status_code == 200
    token = r.get_json()["csrf_token"]
    assert client.get("/api/session").get_json()["user"]["email"] == "user@example.org"
    r = client.post("/api/reset", json={"urls": ["http://a.example/"]})
    assert r.status_code == 403 and "X-CSRF-Token" in r.get_json()["message"]
    r = client.post(
        "/api/reset", json={"urls": ["http://a.example/"]}, headers={"X-CSRF-Token": "forged"}
    )
    assert r.status_code == 403
    r = client.post(
        "/api/reset", json={"urls": ["http://a.example/"]}, headers={"X-CSRF-Token": token}
    )
    assert r.status_code == 200 and r.get_json()["unknown"] == ["http://a.example/"]
    assert client.delete("/api/session").status_code == 403
    assert client.delete("/api/session", headers={"X-CSRF-Token": token}).status_code == 204
    assert client.get("/api/session").get_json()["user"] is None
    # HTTP Basic: no cookie, no token needed; wrong credentials are a 401 with a challenge.
    fresh = client.application.test_client()
    r = fresh.post("/api/reset", json={"urls": ["http://a.example/"]}, headers=USER)
    assert r.status_code == 200
    r = fresh.post("/api/reset", json={"urls": ["x"]}, headers=basic("user@example.org", "no"))
    assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Basic")
    bad = fresh.post("/api/session", json={"email": "user@example.org", "password": "nope"})
    assert bad.status_code == 401


def test_signup_through_the_api(client: FlaskClient) -> None:
    r = client.post("/api/users", json={"email": "new@example.org", "password": PASSWORD})
    assert r.status_code == 202 and "confirm" in r.get_json()["message"]
    assert (
        client.post(
            "/api/session", json={"email": "new@example.org", "password": PASSWORD}
        ).get_json()["user"]["email"]
        == "new@example.org"
    )
    client = client.application.test_client()  # a visitor again
    for body, status in [
        ({"email": "x@example.org", "password": "short"}, 400),
        ({"email": 5, "password": PASSWORD}, 400),
        ({"email": "x@example.org"}, 400),
    ]:
        assert client.post("/api/users", json=body).status_code == status


def test_tracked_pages_history_and_diff(app: Flask, client: FlaskClient) -> None:
    r = client.post(
        "/api/pages", json={"url": "http://news.example/", "selector": "main"}, headers=USER
    )
    assert r.status_code == 201
    page_id = r.get_json()["id"]
    assert client.get("/api/pages", headers=USER).get_json()["pages"][0]["selector"] == "main"
    assert client.get("/api/pages", headers=OPS).get_json()["pages"] == []
    with sessionmaker(app.extensions["jodl"].engine).begin() as s:
        for kind, text in (("baseline", "a\nb\n<script>"), ("change", "a\nc\n<script>")):
            s.add(
                Snapshot(
                    page_id=page_id, selector="main", kind=kind, fingerprint=kind,
                    text_z=compress(text), chars=len(text), status=200,
                )
            )  # fmt: skip
    hist = client.get(f"/api/pages/{page_id}", headers=USER).get_json()
    assert [s["kind"] for s in hist["snapshots"]] == ["change", "baseline"]
    diff = client.get(f"/api/pages/{page_id}/diff", headers=USER)
    assert diff.headers["Content-Type"] == "application/json"
    data = diff.get_json()
    kinds = [(ln["kind"], ln["text"], ln["old_no"], ln["new_no"]) for ln in data["inline"]]
    assert kinds == [
        ("same", "a", 1, 1),
        ("remove", "b", 2, None),
        ("add", "c", None, 2),
        ("same", "<script>", 3, 3),
    ]  # no diff syntax: no "---", "@@", "-b"
    assert data["inline"][1]["pieces"] == [{"text": "b", "changed": True}]
    (change,) = [r for r in data["side_by_side"] if r["kind"] == "change"]
    assert (change["left"], change["right"]) == ("b", "c")
    for query, status in [("?a=x", 400), ("?a=999", 404), ("?a=99999999999999999999", 404)]:
        assert client.get(f"/api/pages/{page_id}/diff{query}", headers=USER).status_code == status
    assert client.get(f"/api/pages/{page_id}", headers=OPS).status_code == 404
    assert client.delete(f"/api/pages/{page_id}", headers=OPS).status_code == 404
    assert client.delete(f"/api/pages/{page_id}", headers=USER).status_code == 204
    for body in (
        {"url": "javascript:alert(1)"},
        {"url": 5},
        {"url": "http://a.example/", "selector": "p[["},
        {"url": "http://a.example/", "selector": ["p"]},
    ):
        assert client.post("/api/pages", json=body, headers=USER).status_code == 400


def test_operator_endpoints(tmp_path: Path) -> None:
    app = make_app(tmp_path)
    client = app.test_client()
    assert client.get("/api/admin/status", headers=USER).status_code == 403
    assert client.get("/api/admin/status").status_code == 401
    r = client.post("/api/admin/nodes", json={"address": "127.0.0.1:9", "slots": 3}, headers=OPS)
    assert r.status_code == 201
    status = client.get("/api/admin/status", headers=OPS).get_json()
    assert [(n["address"], n["slots"], n["state"]) for n in status["nodes"]] == [
        ("127.0.0.1:9", 3, "active")
    ]
    assert status["can_start_cycle"] is True
    for body in (
        {"address": "nope"},
        {"address": "127.0.0.1:9", "slots": 0},
        {"address": "127.0.0.1:9", "slots": True},
        {"address": 9},
    ):
        assert client.post("/api/admin/nodes", json=body, headers=OPS).status_code == 400
    r = client.post("/api/admin/nodes/drain", json={"address": "127.0.0.1:9"}, headers=OPS)
    assert r.status_code == 200 and r.get_json()["message"] == "node 127.0.0.1:9 draining"
    assert client.get("/api/admin/status", headers=OPS).get_json()["nodes"][0]["state"] == (
        "draining"
    )
    r = client.post("/api/admin/nodes/drain", json={"address": "1.2.3.4:5"}, headers=OPS)
    assert r.status_code == 404
    r = client.post("/api/admin/nodes/remove", json={"address": "127.0.0.1:9"}, headers=OPS)
    assert r.status_code == 200
    assert client.get("/api/admin/status", headers=OPS).get_json()["nodes"][0]["state"] == "removed"
    assert (
        client.post(
            "/api/admin/nodes/remove", json={"address": "1.2.3.4:5"}, headers=OPS
        ).status_code
        == 404
    )


def test_a_cycle_request_is_recorded_for_a_master(client: FlaskClient) -> None:
    assert client.post("/api/admin/cycles", json={}, headers=USER).status_code == 403
    assert client.post("/api/admin/cycles", json={}).status_code == 401
    r = client.post("/api/admin/cycles", json={}, headers=OPS)
    assert r.status_code == 202
    answer = r.get_json()
    assert answer["state"] == "requested" and "requested" in answer["message"]
    # A session (not Basic) needs the CSRF header.
    client.post("/api/session", json={"email": "ops@example.org", "password": PASSWORD})
    assert client.post("/api/admin/cycles", json={}).status_code == 403
    csrf = {"X-CSRF-Token": client.get("/api/session").get_json()["csrf_token"]}
    assert client.post("/api/admin/cycles", json={}, headers=csrf).status_code == 202
    status = client.get("/api/admin/status").get_json()
    assert status["can_start_cycle"] is True
    pending = status["cycle_requests"]
    assert [(p["id"], p["requested_by"]) for p in pending] == [
        (answer["id"], "ops@example.org"),
        (answer["id"] + 1, "ops@example.org"),
    ]
    engine = client.application.extensions["jodl"].engine
    assert claim(engine, "m1") == [answer["id"], answer["id"] + 1]
    assert claim(engine, "m2") == []  # taken once
    assert client.get("/api/admin/status").get_json()["cycle_requests"] == []


def test_openapi_describes_every_api_route(app: Flask, client: FlaskClient) -> None:
    doc = client.get("/api/openapi.json").get_json()
    assert doc["openapi"].startswith("3.")
    documented = {(path, method) for path, ops in doc["paths"].items() for method in ops}
    served = set()
    for rule in app.url_map.iter_rules():
        if not (rule.rule.startswith("/api/") or rule.rule in ("/healthz", "/metrics")):
            continue
        path = re.sub(r"<(?:[a-z]+:)?([a-z_]+)>", r"{\1}", rule.rule)
        for method in rule.methods - {"HEAD", "OPTIONS"}:  # type: ignore[operator]
            served.add((path, method.lower()))
    assert served == documented
    limits = doc["paths"]["/api/batches"]["post"]["requestBody"]["content"]["application/json"]
    assert limits["schema"]["properties"]["urls"]["maxItems"] == 100


def test_health_and_metrics(client: FlaskClient) -> None:
    assert client.get("/healthz").get_json() == {"status": "ok", "database": "ok"}
    client.post("/api/batches", json={"urls": ["http://a.example/", "ftp://b"]})
    text = client.get("/metrics").get_data(as_text=True)
    sample = re.compile(r'^[a-z_]+(\{([a-z_]+="[^"\n]*",?)*\})? -?[0-9.e+]+$')
    for line in text.splitlines():
        assert line.startswith("# HELP ") or line.startswith("# TYPE ") or sample.match(line), line
    assert 'jodl_web_urls_total{answer="queued"} 1.0' in text
    assert 'jodl_web_urls_total{answer="refused"} 1.0' in text
    assert 'jodl_queue_jobs{family="check_page",state="queued"} 1.0' in text
    assert "jodl_web_streams_open 0.0" in text


def test_stream_slots_are_limited(tmp_path: Path) -> None:
    app = make_app(tmp_path, web_threads=4, web_max_streams=1, web_stream_poll=0.01)
    client = app.test_client()
    batch = client.post("/api/batches", json={"urls": ["http://a.example/"]}).get_json()
    svc = app.extensions["jodl"]
    slot = svc.streams.take("addr:10.0.0.9", "addr:10.0.0.9")  # another client holds the only slot
    assert slot is not None
    try:
        body = client.get(batch["events"]).get_data(as_text=True)
    finally:
        svc.streams.give_back(slot)
    assert body.startswith("retry: 3000\n") and "event:" not in body


def test_json_errors_everywhere_under_api(client: FlaskClient) -> None:
    for method, path in [
        ("get", "/api/nope"),
        ("put", "/api/batches"),
        ("get", "/api/pages/abc"),
        ("post", "/api/admin/cycles"),
    ]:
        r = getattr(client, method)(path)
        assert r.status_code in (401, 404, 405, 415)
        assert r.headers["Content-Type"] == "application/json"
        assert set(json.loads(r.get_data())) == {"error", "message"}


def test_operator_status_stream(tmp_path: Path) -> None:
    app = make_app(tmp_path, web_stream_seconds=0.01)
    client = app.test_client()
    assert client.get("/api/admin/events", headers=USER).status_code == 403
    client.post("/api/admin/nodes", json={"address": "127.0.0.1:9"}, headers=OPS)
    r = client.get("/api/admin/events", headers=OPS)
    assert r.headers["Content-Type"].startswith("text/event-stream")
    blocks = [b for b in r.get_data(as_text=True).split("\n\n") if "event: status" in b]
    assert blocks, "no status event"
    data = json.loads(blocks[0].split("data: ", 1)[1])
    assert [n["address"] for n in data["nodes"]] == ["127.0.0.1:9"]
    assert set(data) >= {"nodes", "runs", "queue", "families"}


def test_an_operator_cancels_a_running_run(client: FlaskClient) -> None:
    store = Store(client.application.extensions["jodl"].engine)
    run, _ = store.open_run(store.ensure_family("mark"), 0)
    url = f"/api/admin/runs/{run.id}/cancel"
    assert client.post(url, json={}, headers=USER).status_code == 403
    assert client.post(url, json={}).status_code == 401
    client.post("/api/session", json={"email": "ops@example.org", "password": PASSWORD})
    assert client.post(url, json={}).status_code == 403  # a session needs the CSRF header
    csrf = {"X-CSRF-Token": client.get("/api/session").get_json()["csrf_token"]}
    r = client.post(url, json={}, headers=csrf)  # no master runs: cancelled at once
    assert r.status_code == 202 and r.get_json()["state"] == "cancelled"
    assert store.reads.run(run.id).state == RunState.CANCELLED
    assert client.post(url, json={}, headers=csrf).status_code == 409
    assert client.post("/api/admin/runs/999/cancel", json={}, headers=csrf).status_code == 404
    # With a master holding the lease, the cancel is a request it takes.
    second, _ = store.open_run(store.ensure_family("mark"), 0)
    store.acquire_lease("elsewhere:1")
    r = client.post(f"/api/admin/runs/{second.id}/cancel", json={}, headers=OPS)
    assert r.status_code == 202 and r.get_json()["state"] == "requested"
    taken = store.take_requests("m1", [RequestKind.CANCEL])
    assert [(t.id, t.family) for t in taken] == [(r.get_json()["id"], "mark")]
    # The operator's run page has the button while the run runs.
    client.post("/api/session", json={"email": "ops@example.org", "password": PASSWORD})
    page = client.get(f"/admin/runs/{second.id}").get_data(as_text=True)
    assert f"/admin/runs/{second.id}/cancel" in page
