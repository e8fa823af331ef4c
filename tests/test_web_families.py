"""Operators' families in the JSON API and the HTML views (Flask test client)."""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from crawler_app.users.pages import add_user
from jodl.log import Store, make_engine
from jodl.log.migrate import upgrade
from jodl.log.models import FamilyOnNode, FamilyRow, Job
from web.app import create_app
from web.settings import WebSettings

PASSWORD = "correct horse battery"


def basic(email: str) -> dict[str, str]:
    raw = base64.b64encode(f"{email}:{PASSWORD}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


USER = basic("user@example.org")
OPS = basic("ops@example.org")


@pytest.fixture
def app(db_url: str) -> Iterator[Flask]:
    engine = make_engine(db_url)
    upgrade(engine)
    with sessionmaker(engine).begin() as s:
        add_user(s, "user@example.org", PASSWORD)
        add_user(s, "ops@example.org", PASSWORD).is_admin = True
    store = Store(engine)
    fam = store.ensure_family("noop")
    store.add_jobs(fam, [(f"k{i}", "{}") for i in range(3)])
    store.add_node("127.0.0.1:7001", slots=4)
    application = create_app(
        WebSettings(database_url=db_url, web_secure_cookies=False), engine=engine
    )
    application.testing = True
    yield application
    engine.dispose()


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


def snapshot(app: Flask) -> Any:
    engine = app.extensions["jodl"].engine
    with engine.connect() as conn:
        return (
            conn.execute(select(FamilyRow.__table__)).all(),
            conn.execute(select(FamilyOnNode.__table__)).all(),
            conn.execute(select(Job.__table__).order_by(Job.id)).all(),
        )


def test_api_needs_an_operator(client: FlaskClient) -> None:
    for path in (
        "/api/admin/families",
        "/api/admin/families/noop",
        "/api/admin/families/noop/nodes",
        "/api/admin/families/noop/jobs",
    ):
        assert client.get(path).status_code == 401
        assert client.get(path, headers=USER).status_code == 403
    r = client.patch("/api/admin/families/noop", json={"timeout": 3}, headers=USER)
    assert r.status_code == 403


def test_api_reads_and_changes_families(app: Flask, client: FlaskClient) -> None:
    listed = client.get("/api/admin/families", headers=OPS).get_json()
    assert [f["name"] for f in listed["families"]] == ["noop"]
    r = client.patch(
        "/api/admin/families/noop",
        json={"timeout": 4, "schedule": "*/3 * * * * *", "strategy": "least_loaded",
              "priority": 2, "idempotent": True},
    )  # fmt: skip
    assert r.status_code == 401  # no credentials: nothing changes
    r = client.patch(
        "/api/admin/families/noop",
        json={"timeout": 4, "schedule": "*/3 * * * * *", "strategy": "least_loaded",
              "priority": 2, "idempotent": True},
        headers=OPS,
    )  # fmt: skip
    assert r.status_code == 200, r.get_json()
    doc = r.get_json()
    assert (doc["timeout"], doc["schedule"], doc["strategy"], doc["priority"]) == (
        4.0,
        "*/3 * * * * *",
        "least_loaded",
        2,
    )
    assert client.get("/api/admin/families/noop", headers=OPS).get_json() == doc
    r = client.post(
        "/api/admin/families/noop/nodes",
        json={"nodes": ["127.0.0.1:7001"], "max_slots": 1, "labels": {"zone": "a"}},
        headers=OPS,
    )
    assert r.status_code == 200, r.get_json()
    rules = client.get("/api/admin/families/noop/nodes", headers=OPS).get_json()["nodes"]
    assert rules == [
        {"node": "127.0.0.1:7001", "allowed": True, "max_slots": 1, "labels": {"zone": "a"}}
    ]
    jobs = client.get("/api/admin/families/noop/jobs?limit=2", headers=OPS).get_json()["jobs"]
    assert [j["key"] for j in jobs] == ["k0", "k1"] and jobs[0]["priority"] == 2
    dead = client.get("/api/admin/families/noop/jobs?state=dead", headers=OPS).get_json()
    assert dead == {"jobs": []}


@pytest.mark.parametrize(
    ("method", "path", "body", "code"),
    [
        ("get", "/api/admin/families/nope", None, 404),
        ("patch", "/api/admin/families/nope", {"timeout": 3}, 404),
        ("patch", "/api/admin/families/noop", {"schedule": "99 * * * *"}, 400),
        ("patch", "/api/admin/families/noop", {"strategy": "fastest"}, 400),
        ("patch", "/api/admin/families/noop", {"timeout": -1}, 400),
        ("patch", "/api/admin/families/noop", {"color": "red"}, 400),
        ("patch", "/api/admin/families/noop", {"timeout": 9, "max_attempts": 0}, 400),
        ("patch", "/api/admin/families/noop", {}, 400),
        ("post", "/api/admin/families/noop/nodes", {"nodes": ["1.2.3.4:5"]}, 400),
        ("post", "/api/admin/families/noop/nodes", {"nodes": "x", "max_slots": "2"}, 400),
        (
            "post",
            "/api/admin/families/noop/nodes",
            {"nodes": ["127.0.0.1:7001"], "max_slots": 0},
            400,
        ),
        ("post", "/api/admin/families/nope/nodes", {"nodes": ["127.0.0.1:7001"]}, 404),
        ("get", "/api/admin/families/noop/jobs?limit=-1", None, 400),
        ("get", "/api/admin/families/noop/jobs?limit=x", None, 400),
        ("get", "/api/admin/families/noop/jobs?state=running", None, 400),
        ("get", "/api/admin/families/nope/jobs", None, 404),
    ],
)
def test_api_refusals_change_nothing(
    app: Flask, client: FlaskClient, method: str, path: str, body: Any, code: int
) -> None:
    before = snapshot(app)
    r = getattr(client, method)(path, json=body, headers=OPS)
    assert r.status_code == code, r.get_data(as_text=True)
    assert r.get_json()["message"]
    assert snapshot(app) == before


def token(client: FlaskClient, path: str) -> str:
    found = re.search(r'name="csrf_token" value="([^"]+)"', client.get(path).get_data(as_text=True))
    assert found, f"no CSRF token on {path}"
    return found.group(1)


def test_operator_page_and_forms(app: Flask, client: FlaskClient) -> None:
    assert client.get("/admin/families/").status_code in (302, 303, 401)
    r = client.post(
        "/login",
        data={
            "email": "ops@example.org",
            "password": PASSWORD,
            "csrf_token": token(client, "/login"),
        },
    )
    assert r.status_code == 303
    page = client.get("/admin/families/").get_data(as_text=True)
    assert "noop" in page and "earliest_finish" in page
    good = token(client, "/admin/families/")
    before = snapshot(app)
    for bad in (None, "wrong"):  # forms without the session's token change nothing
        form = {"timeout": "5"} if bad is None else {"timeout": "5", "csrf_token": bad}
        assert client.post("/admin/families/noop", data=form).status_code == 403
        nodes = {"nodes": "127.0.0.1:7001", "allowed": "false"}
        if bad is not None:
            nodes["csrf_token"] = bad
        assert client.post("/admin/families/noop/nodes", data=nodes).status_code == 403
    assert snapshot(app) == before
    r = client.post(
        "/admin/families/noop",
        data={"csrf_token": good, "timeout": "5", "schedule": "0 6 * * *", "idempotent": "true"},
    )
    assert r.status_code == 303
    r = client.post("/admin/families/noop", data={"csrf_token": good, "schedule": "every morning"})
    assert r.status_code == 400 and "schedule" in r.get_data(as_text=True)
    r = client.post(
        "/admin/families/noop/nodes",
        data={"csrf_token": good, "nodes": "127.0.0.1:7001", "allowed": "false"},
    )
    assert r.status_code == 303
    store = Store(app.extensions["jodl"].engine)
    fam = store.family("noop")
    assert fam is not None
    assert (fam.timeout, fam.schedule, fam.idempotent) == (5.0, "0 6 * * *", True)
    assert [r.allowed for r in store.family_rules(fam.id).values()] == [False]
    page = client.get("/admin/families/").get_data(as_text=True)
    assert "0 6 * * *" in page and "127.0.0.1:7001" in page


def test_a_refused_form_comes_back_as_typed(app: Flask, client: FlaskClient) -> None:
    """Issue 24: a bad value shows the form again as typed, the error by its field, 400,
    and saves nothing."""
    import lxml.html

    r = client.post(
        "/login",
        data={
            "email": "ops@example.org",
            "password": PASSWORD,
            "csrf_token": token(client, "/login"),
        },
    )
    assert r.status_code == 303
    good = token(client, "/admin/families/")
    before = snapshot(app)

    def typed(page: str, action: str) -> tuple[Any, dict[str, str]]:
        doc = lxml.html.fromstring(page)
        (form,) = doc.xpath(f"//div[@id='family-noop']//form[@action='{action}']")
        return doc, {i.get("name"): i.get("value") or "" for i in form.xpath(".//input")}

    settings = {
        "timeout": "7",
        "max_attempts": "3",
        "schedule": "every morning",  # the bad one
        "strategy_params": '{"explore": 0.1}',
    }
    r = client.post("/admin/families/noop", data={"csrf_token": good, **settings})
    assert r.status_code == 400
    doc, values = typed(r.get_data(as_text=True), "/admin/families/noop")
    assert {k: values[k] for k in settings} == settings
    error = doc.get_element_by_id("error-settings-schedule")
    assert "schedule" in error.text_content()
    assert error.getparent().xpath("./input/@name") == ["schedule"]  # beside its field
    assert snapshot(app) == before

    rules = {"nodes": "127.0.0.1:7001", "allowed": "true", "max_slots": "many", "labels": "zone=a"}
    r = client.post("/admin/families/noop/nodes", data={"csrf_token": good, **rules})
    assert r.status_code == 400
    doc, values = typed(r.get_data(as_text=True), "/admin/families/noop/nodes")
    assert {k: values[k] for k in rules} == rules
    error = doc.get_element_by_id("error-nodes-max_slots")
    assert error.getparent().xpath("./input/@name") == ["max_slots"]
    assert snapshot(app) == before
    # The page as usual shows empty forms again.
    _doc, values = typed(
        client.get("/admin/families/").get_data(as_text=True), "/admin/families/noop"
    )
    assert values["timeout"] == "" and values["schedule"] == ""
