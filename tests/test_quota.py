"""Per-user quotas: trackings, URLs per day, largest batch; in the CLI, the API and the UI.

Each quota refuses the first request over it, whole, with one clear error, and
nothing changes: no tracking added, no URL queued, no batch written. Operators
set a user's quotas with ``jodl users quota`` and ``POST /api/admin/quota``.
"""

from __future__ import annotations

import base64
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker

from crawler_app.models import Tracking, User
from crawler_app.users.pages import add_user
from crawler_app.users.quota import QuotaExceeded, set_quota
from jodl.cli import main
from jodl.log import make_engine
from jodl.log.migrate import upgrade
from jodl.log.models import Job
from web.app import create_app
from web.models import Batch
from web.settings import WebSettings

PASSWORD = "correct horse battery"
USER = "user@example.org"
OPS = "ops@example.org"


def basic(email: str) -> dict[str, str]:
    raw = base64.b64encode(f"{email}:{PASSWORD}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


@pytest.fixture
def app(db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Flask]:
    for name in ("JODL_USER_MAX_TRACKINGS", "JODL_USER_URLS_PER_DAY", "JODL_USER_MAX_BATCH"):
        monkeypatch.delenv(name, raising=False)
    engine = make_engine(db_url)
    upgrade(engine)
    settings = WebSettings(
        database_url=db_url, web_secure_cookies=False, web_submit_burst=1000, web_batch_max=50
    )
    application = create_app(settings, engine=engine)
    with sessionmaker(engine).begin() as s:
        add_user(s, USER, PASSWORD)
        add_user(s, OPS, PASSWORD).is_admin = True
    yield application
    engine.dispose()


def jodl(db_url: str, *args: str) -> Any:
    return CliRunner().invoke(main, ["--database-url", db_url, *args])


def counts(app: Flask) -> tuple[int, int, int]:
    """(trackings, batches, jobs) in the database."""
    with sessionmaker(app.extensions["jodl"].engine)() as s:
        return (
            s.scalar(select(func.count()).select_from(Tracking)) or 0,
            s.scalar(select(func.count()).select_from(Batch)) or 0,
            s.scalar(select(func.count()).select_from(Job)) or 0,
        )


def refusals(app: Flask, quota: str) -> float:
    return app.extensions["jodl"].metrics.value("jodl_web_quota_refused_total", quota=quota)


def urls(n: int, start: int = 0) -> list[str]:
    return [f"http://site{i}.example/" for i in range(start, start + n)]


def test_quota_command_sets_shows_and_refuses_bad_input(app: Flask, db_url: str) -> None:
    r = jodl(db_url, "users", "quota", USER)
    assert r.exit_code == 0, r.output
    assert "trackings 500 (0 used), urls per day 5000, batch 100" in r.output
    r = jodl(db_url, "users", "quota", USER, "--trackings", "2", "--batch", "0")
    assert r.exit_code == 0, r.output
    assert "now has quotas: trackings 2 (0 used), urls per day 5000, batch no limit" in r.output
    # Bad input: one clear line, non-zero exit, nothing changed.
    for bad in (["--trackings", "-1"], ["--urls-per-day", "many"]):
        r = jodl(db_url, "users", "quota", USER, *bad)
        assert r.exit_code != 0 and "Error" in r.output
    r = jodl(db_url, "users", "quota", "nobody@example.org", "--trackings", "3")
    assert r.exit_code == 1 and r.output.strip().count("\n") == 0, r.output
    assert "no user nobody@example.org" in r.output
    r = jodl(db_url, "users", "quota", USER, "--trackings", "default")
    assert "trackings 500 (0 used), urls per day 5000, batch no limit" in r.output


def test_trackings_quota_refuses_the_first_page_over_it(app: Flask, db_url: str) -> None:
    assert jodl(db_url, "users", "quota", USER, "--trackings", "2").exit_code == 0
    for url in urls(2):
        r = jodl(db_url, "track", url, "--user", USER)
        assert r.exit_code == 0, r.output
    before = counts(app)
    # CLI: one line, exit 1, nothing added.
    r = jodl(db_url, "track", "http://third.example/", "--user", USER)
    assert r.exit_code == 1
    assert r.output.strip() == (
        f"error: {USER} already tracks 2 pages, the most allowed (2); stop tracking one "
        "first, or ask an operator for a larger quota"
    )
    assert counts(app) == before
    # Tracking a page again through the same view is no new tracking: allowed; another
    # view of it is one more tracking, and counts.
    assert jodl(db_url, "track", urls(1)[0], "--user", USER).exit_code == 0
    assert jodl(db_url, "track", urls(1)[0], "--user", USER, "--selector", "h1").exit_code == 1
    # API: 403 quota_exceeded, counted.
    client = app.test_client()
    r = client.post("/api/pages", json={"url": "http://third.example/"}, headers=basic(USER))
    assert r.status_code == 403
    assert r.get_json()["error"] == "quota_exceeded"
    assert "already tracks 2 pages" in r.get_json()["message"]
    assert refusals(app, "trackings") == 1
    assert counts(app) == before
    # UI: the message on the page, 403, nothing added.
    login(client, USER)
    r = client.post(
        "/pages",
        data={"url": "http://third.example/", "csrf_token": token(client, "/pages")},
    )
    assert r.status_code == 403 and "already tracks 2 pages" in r.get_data(as_text=True)
    assert counts(app) == before and refusals(app, "trackings") == 2
    # The user sees the quota and its use.
    got = app.test_client().get("/api/quota", headers=basic(USER)).get_json()
    assert got["limits"]["trackings"] == 2 and got["used"]["trackings"] == 2


def test_batch_quota_refuses_a_larger_batch(app: Flask) -> None:
    client = app.test_client()
    r = client.post("/api/admin/quota", json={"email": USER, "batch": 3}, headers=basic(OPS))
    assert r.status_code == 200, r.get_json()
    assert r.get_json()["limits"] == {"trackings": 500, "urls_per_day": 5000, "batch": 3}
    r = client.post("/api/batches", json={"urls": urls(4)}, headers=basic(USER))
    assert r.status_code == 403
    assert r.get_json() == {
        "error": "quota_exceeded",
        "message": "4 URLs given; your quota is 3 per submission: split them",
    }
    assert counts(app) == (0, 0, 0) and refusals(app, "batch") == 1
    r = client.post("/api/batches", json={"urls": urls(3)}, headers=basic(USER))
    assert r.status_code == 201 and r.get_json()["queued"] == 3
    # Over the site's JODL_WEB_BATCH_MAX it stays a plain bad request.
    assert client.post("/api/admin/quota", json={"email": USER, "batch": 0}, headers=basic(OPS))
    r = client.post("/api/batches", json={"urls": urls(51)}, headers=basic(USER))
    assert r.status_code == 400


def test_daily_quota_refuses_a_batch_whole(app: Flask) -> None:
    client = app.test_client()
    r = client.post("/api/admin/quota", json={"email": USER, "urls_per_day": 5}, headers=basic(OPS))
    assert r.status_code == 200
    assert (
        client.post("/api/batches", json={"urls": urls(3)}, headers=basic(USER)).status_code == 201
    )
    before = counts(app)
    # 3 + 3 > 5: the batch is refused whole, not partly queued.
    r = client.post("/api/batches", json={"urls": urls(3, 10)}, headers=basic(USER))
    assert r.status_code == 403 and r.get_json()["error"] == "quota_exceeded"
    assert (
        "only 2 more of your 5 per 24 hours are left; nothing was queued"
        in (r.get_json()["message"])
    )
    assert counts(app) == before and refusals(app, "urls_per_day") == 1
    # The UI shows the same refusal.
    login(client, USER)
    r = client.post(
        "/batches", data={"urls": "\n".join(urls(3, 20)), "csrf_token": token(client, "/")}
    )
    assert r.status_code == 403 and "per 24 hours are left" in r.get_data(as_text=True)
    assert counts(app) == before and refusals(app, "urls_per_day") == 2
    # What is left may still be used; then the next URL is refused.
    ok = app.test_client().post("/api/batches", json={"urls": urls(2, 30)}, headers=basic(USER))
    assert ok.status_code == 201
    over = app.test_client().post("/api/batches", json={"urls": urls(1, 40)}, headers=basic(USER))
    assert over.status_code == 403
    got = app.test_client().get("/api/quota", headers=basic(USER)).get_json()
    assert got["used"]["urls_per_day"] == 5
    # The metric is on the web's /metrics page.
    page = app.test_client().get("/metrics").get_data(as_text=True)
    assert 'jodl_web_quota_refused_total{quota="urls_per_day"} 3.0' in page


def test_defaults_come_from_the_settings(app: Flask, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JODL_USER_MAX_BATCH", "2")
    client = app.test_client()
    r = client.post("/api/batches", json={"urls": urls(3)}, headers=basic(USER))
    assert r.status_code == 403 and "your quota is 2 per submission" in r.get_json()["message"]
    # An operator's override wins over the default; null puts the default back.
    client.post("/api/admin/quota", json={"email": USER, "batch": 10}, headers=basic(OPS))
    assert (
        client.post("/api/batches", json={"urls": urls(3)}, headers=basic(USER)).status_code == 201
    )
    r = client.post("/api/admin/quota", json={"email": USER, "batch": None}, headers=basic(OPS))
    assert r.get_json()["limits"]["batch"] == 2


def test_admin_quota_endpoint_refuses_bad_input_and_non_operators(app: Flask) -> None:
    client = app.test_client()
    for data in (
        {"email": USER, "trackings": -1},
        {"email": USER, "trackings": "3"},
        {"email": USER, "batch": True},
        {"email": USER, "speed": 3},
        {"trackings": 3},
    ):
        r = client.post("/api/admin/quota", json=data, headers=basic(OPS))
        assert r.status_code == 400, data
    r = client.post(
        "/api/admin/quota", json={"email": "nobody@example.org", "batch": 1}, headers=basic(OPS)
    )
    assert r.status_code == 404
    r = client.post("/api/admin/quota", json={"email": USER, "batch": 1}, headers=basic(USER))
    assert r.status_code == 403
    with sessionmaker(app.extensions["jodl"].engine)() as s:
        user = s.scalar(select(User).where(User.email == USER))
        assert user is not None
    got = client.get("/api/quota", headers=basic(USER)).get_json()
    assert got["limits"] == {"trackings": 500, "urls_per_day": 5000, "batch": 100}


# -- the HTML views' helpers ----------------------------------------------------------------


def token(client: FlaskClient, path: str) -> str:
    html = client.get(path).get_data(as_text=True)
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, f"no CSRF token on {path}"
    return found.group(1)


def login(client: FlaskClient, email: str) -> None:
    r = client.post(
        "/login", data={"email": email, "password": PASSWORD, "csrf_token": token(client, "/login")}
    )
    assert r.status_code == 303, r.get_data(as_text=True)


def test_submissions_at_once_cannot_both_pass_the_daily_count(app: Flask) -> None:
    svc = app.extensions["jodl"]
    with sessionmaker(svc.engine).begin() as s:
        user = s.scalar(select(User).where(User.email == USER))
        assert user is not None
        user_id = user.id
        set_quota(s, user, urls_per_day=5)
    outcomes: list[str] = []

    def submit(n: int) -> None:
        try:
            svc.batches.submit(urls(2, 10 * n), user_id)
            outcomes.append("ok")
        except QuotaExceeded:
            outcomes.append("refused")

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["ok", "ok"] + ["refused"] * 4
    assert counts(app)[1] == 2
