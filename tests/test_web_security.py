"""Security hardening of the web UI (issue 14): one test per finding, through Flask's
test client on a real database, or the real ``jodl web`` server where the finding
lives in the server (stream slots, disconnects)."""

from __future__ import annotations

import base64
import os
import re
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from agents import wait_for
from flask import Flask
from flask.testing import FlaskClient
from itsdangerous import base64_decode
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker
from webserver import EventStream, start_web

from crawler_app.models import User
from crawler_app.users.pages import add_user, set_password
from jodl.log import make_engine
from jodl.log.migrate import upgrade
from jodl.log.models import FamilyRow, Job
from web.app import create_app
from web.settings import WebSettings
from web.trial import public_warning, write_login

PASSWORD = "correct horse battery"


def make_app(db_url: str, **settings: Any) -> Flask:
    engine = make_engine(db_url)
    upgrade(engine)
    values: dict[str, Any] = {"web_secure_cookies": False}
    values.update(settings)
    app = create_app(WebSettings(database_url=db_url, **values), engine=engine)
    with sessionmaker(engine).begin() as s:
        add_user(s, "user@example.org", PASSWORD)
        add_user(s, "ops@example.org", PASSWORD).is_admin = True
    return app


@pytest.fixture
def app(db_url: str) -> Iterator[Flask]:
    application = make_app(db_url)
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


def at(address: str) -> dict[str, Any]:
    return {"environ_base": {"REMOTE_ADDR": address}}


def users(app: Flask) -> dict[str, User]:
    with sessionmaker(app.extensions["jodl"].engine)() as s:
        return {u.email: u for u in s.scalars(select(User))}


# -- 6: anonymous submissions -------------------------------------------------------------------


def test_anonymous_submissions_are_off_unless_set(client: FlaskClient) -> None:
    urls = {"urls": ["http://a.example/"]}
    r = client.post("/api/batches", json=urls)
    assert r.status_code == 401 and "log in" in r.get_json()["message"]
    csrf = client.get("/api/session").get_json()["csrf_token"]
    r = client.post("/batches", data={"urls": "http://a.example/", "csrf_token": csrf})
    assert r.status_code == 303 and "/login" in r.headers["Location"]
    assert client.post("/api/batches", json=urls, headers=USER).status_code == 201
    # `jodl up` turns them on, unless the operator said otherwise.
    assert WebSettings.for_up({}).web_anonymous_submit is True
    off = {"JODL_WEB_ANONYMOUS_SUBMIT": "false"}
    assert WebSettings.for_up(off).web_anonymous_submit is False
    assert WebSettings.from_env({}).web_anonymous_submit is False


def test_anonymous_visitors_have_smaller_limits(db_url: str) -> None:
    app = make_app(
        db_url,
        web_anonymous_submit=True,
        web_anonymous_burst=2,
        web_anonymous_per_minute=1.0,
        web_anonymous_batch_max=3,
    )
    client = app.test_client()
    many = {"urls": [f"http://a.example/{i}" for i in range(4)]}
    r = client.post("/api/batches", json=many)
    assert r.status_code == 400 and "at most 3" in r.get_json()["message"]
    one = {"urls": ["http://a.example/"]}
    assert client.post("/api/batches", json=one).status_code == 201
    assert client.post("/api/batches", json=one).status_code == 429
    # A signed-in user from the same address is not held by the anonymous bucket.
    assert client.post("/api/batches", json=many, headers=USER).status_code == 201
    assert client.post("/api/batches", json=one, headers=USER).status_code == 201
    app.extensions["jodl"].engine.dispose()


def test_the_homepage_states_the_visitors_own_batch_limit(db_url: str) -> None:
    app = make_app(db_url, web_anonymous_submit=True, web_batch_max=40, web_anonymous_batch_max=3)
    client = app.test_client()

    def stated(page: str) -> str:
        found = re.search(r"Paste up to (\d+) addresses", page)
        assert found, page
        return found.group(1)

    assert stated(client.get("/").get_data(as_text=True)) == "3"
    # A refused batch shows the form again, with the same limit.
    csrf = client.get("/api/session").get_json()["csrf_token"]
    many = "\n".join(f"http://a.example/{i}" for i in range(4))
    r = client.post("/batches", data={"urls": many, "csrf_token": csrf})
    assert r.status_code == 400 and stated(r.get_data(as_text=True)) == "3"
    login(client)
    assert stated(client.get("/").get_data(as_text=True)) == "40"
    app.extensions["jodl"].engine.dispose()


def test_private_networks_serve_signed_in_users_only(db_url: str) -> None:
    app = make_app(db_url, web_anonymous_submit=True)
    client = app.test_client()
    urls = {"urls": ["http://localhost:9/private", "http://10.1.2.3/"]}
    items = client.post("/api/batches", json=urls).get_json()["items"]
    assert [i["answer"] for i in items] == ["refused", "refused"]
    for item in items:
        assert "log in to check pages on private networks" in item["error"]
        assert "127.0.0.1" not in item["error"]  # the resolved address is never shown
    items = client.post("/api/batches", json=urls, headers=USER).get_json()["items"]
    assert [i["answer"] for i in items] == ["queued", "queued"]
    app.extensions["jodl"].engine.dispose()


# -- 7: logins ----------------------------------------------------------------------------------


def test_failed_logins_do_not_lock_the_owner_out_elsewhere(db_url: str) -> None:
    app = make_app(db_url, web_submit_burst=10, web_submit_per_minute=1.0)
    client = app.test_client()
    wrong = basic("user@example.org", "wrong password")
    codes = [
        client.get("/api/pages", headers=wrong, **at("10.0.0.1")).status_code for _ in range(11)
    ]
    assert codes == [401] * 10 + [429]
    assert client.get("/api/pages", headers=USER, **at("10.0.0.1")).status_code == 429
    # The owner, from another address, is not locked out.
    assert client.get("/api/pages", headers=USER, **at("10.0.0.2")).status_code == 200
    # One address guessing over many accounts is stopped too.
    spray = [
        client.get(
            "/api/pages", headers=basic(f"u{i}@example.org", "guess"), **at("10.0.0.3")
        ).status_code
        for i in range(60)
    ]
    assert spray[0] == 401 and spray[-1] == 429
    app.extensions["jodl"].engine.dispose()


def test_unknown_accounts_cost_a_password_hash(client: FlaskClient) -> None:
    from web.auth import _dummy_hash

    _dummy_hash.cache_clear()
    r = client.post("/api/session", json={"email": "nobody@example.org", "password": "x" * 9})
    assert r.status_code == 401 and r.get_json()["message"] == "wrong e-mail or password"
    # The unknown account was answered after checking the password against a hash.
    assert _dummy_hash.cache_info().misses == 1


def test_signup_does_not_reveal_existing_accounts(client: FlaskClient, app: Flask) -> None:
    before = users(app)["user@example.org"].password_hash
    taken = client.post("/api/users", json={"email": "user@example.org", "password": "x" * 12})
    fresh = client.post("/api/users", json={"email": "new@example.org", "password": "x" * 12})
    assert (taken.status_code, taken.get_json()) == (fresh.status_code, fresh.get_json())
    assert users(app)["user@example.org"].password_hash == before


# -- 8: one confirmed address -------------------------------------------------------------------


def test_one_address_per_email_field(client: FlaskClient) -> None:
    for email in ("me@attacker.example,postmaster", "a@x.org;b@y.org", "a@x.org <b@y.org>"):
        r = client.post("/api/users", json={"email": email, "password": PASSWORD})
        assert r.status_code == 400 and "not an e-mail address" in r.get_json()["message"]


def test_signup_mails_a_link_that_confirms_the_address(client: FlaskClient, app: Flask) -> None:
    r = client.post("/api/users", json={"email": "new@example.org", "password": PASSWORD})
    assert r.status_code == 202
    assert users(app)["new@example.org"].email_confirmed is False
    assert users(app)["user@example.org"].email_confirmed is True  # added by an operator
    with sessionmaker(app.extensions["jodl"].engine)() as s:
        (payload,) = s.scalars(
            select(Job.payload)
            .join(FamilyRow, FamilyRow.id == Job.family_id)
            .where(FamilyRow.name == "notify")
        ).all()
    mail = __import__("json").loads(payload)
    assert mail["to"] == "new@example.org"
    link = next(w for w in mail["text"].split() if "/confirm/" in w)
    path = "/" + link.split("/", 3)[3]
    assert client.get(path[:-3] + "xyz").status_code == 404  # a forged link
    r = client.get(path)
    assert r.status_code == 303
    assert users(app)["new@example.org"].email_confirmed is True


# -- 11: revocable sessions ---------------------------------------------------------------------


def session_cookie(client: FlaskClient) -> str:
    cookie = client.get_cookie("jodl_session")
    assert cookie is not None
    return cookie.value


def login(client: FlaskClient, email: str = "user@example.org") -> str:
    r = client.post("/api/session", json={"email": email, "password": PASSWORD})
    assert r.status_code == 200
    token: str = r.get_json()["csrf_token"]
    return token


def test_logout_ends_copied_sessions_and_tokens(app: Flask) -> None:
    client = app.test_client()
    csrf = login(client)
    copied = session_cookie(client)
    token = client.post("/api/tokens", json={}, headers={"X-CSRF-Token": csrf}).get_json()["token"]
    bearer = {"Authorization": f"Bearer {token}"}
    thief = app.test_client()
    thief.set_cookie("jodl_session", copied)
    assert thief.get("/api/pages").status_code == 200
    assert app.test_client().get("/api/pages", headers=bearer).status_code == 200
    assert client.delete("/api/session", headers={"X-CSRF-Token": csrf}).status_code == 204
    assert thief.get("/api/pages").status_code == 401
    assert app.test_client().get("/api/pages", headers=bearer).status_code == 401


def test_a_password_change_ends_every_session(app: Flask) -> None:
    client = app.test_client()
    login(client)
    assert client.get("/api/pages").status_code == 200
    with sessionmaker(app.extensions["jodl"].engine).begin() as s:
        user = s.scalar(select(User).where(User.email == "user@example.org"))
        assert user is not None
        set_password(user, "another good password")
    assert client.get("/api/pages").status_code == 401


def test_the_cookie_carries_nothing_of_the_password_hash(app: Flask) -> None:
    client = app.test_client()
    login(client)
    value = session_cookie(client)
    compressed = value.startswith(".")
    raw = base64_decode(value.split(".")[1] if compressed else value.split(".")[0])
    text = (zlib.decompress(raw) if compressed else raw).decode()
    digest = users(app)["user@example.org"].password_hash or ""
    for start in range(0, len(digest) - 6):
        assert digest[start : start + 6] not in text


# -- 12: SQLite files ---------------------------------------------------------------------------


def test_sqlite_files_are_created_private(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    for name in ("new.db", "new.db-wal", "new.db-shm"):
        if (tmp_path / name).exists():
            assert stat.S_IMODE(os.stat(tmp_path / name).st_mode) == 0o600, name
    engine.dispose()


# -- 15: defaults -------------------------------------------------------------------------------


def test_metrics_for_this_machine_and_operators(client: FlaskClient) -> None:
    assert client.get("/metrics").status_code == 200  # loopback
    assert client.get("/metrics", **at("203.0.113.9")).status_code == 403
    assert client.get("/metrics", headers=OPS, **at("203.0.113.9")).status_code == 403  # not API
    ops = client.application.test_client()
    login(ops, "ops@example.org")
    assert ops.get("/metrics", **at("203.0.113.9")).status_code == 200


def test_only_trusted_host_names_are_answered(client: FlaskClient) -> None:
    assert client.get("/", headers={"Host": "localhost:8080"}).status_code == 200
    assert client.get("/", headers={"Host": "127.0.0.1:8080"}).status_code == 200
    r = client.get("/api/session", headers={"Host": "rebound.attacker.example"})
    assert r.status_code == 400
    named = WebSettings(web_listen="jodl.intra.example:80", web_trusted_hosts=())
    assert "jodl.intra.example" in named.trusted_hosts()


def test_an_untrusted_host_gets_a_plain_400_on_html_pages_too(
    client: FlaskClient, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 20: not a 500 with a traceback in the log for each such request."""
    for path in ("/", "/login", "/admin/", "/no-such-page"):
        r = client.get(path, headers={"Host": "rebound.attacker.example"})
        assert r.status_code == 400, path
        assert "not trusted" in r.get_data(as_text=True)
    assert not [rec for rec in caplog.records if rec.levelname in ("ERROR", "CRITICAL")]


def test_few_threads_are_accepted() -> None:
    settings = WebSettings.from_env({}, web_threads=4)
    assert settings.web_max_streams + settings.web_operator_streams <= 4
    settings = WebSettings.from_env({"JODL_WEB_THREADS": "2"})
    assert settings.web_max_streams == 1


def test_up_keeps_secure_cookies_when_asked_and_hides_the_password(tmp_path: Path) -> None:
    assert WebSettings.for_up({}).web_secure_cookies is False
    asked = {"JODL_WEB_SECURE_COOKIES": "true"}
    assert WebSettings.for_up(asked).web_secure_cookies is True
    path = write_login("admin@localhost", "s3cret-pass", tmp_path / "login.txt")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert public_warning("127.0.0.1") is None and public_warning("localhost") is None
    assert "warning" in (public_warning("0.0.0.0") or "")


# -- 16: API and document agree -----------------------------------------------------------------


SURROGATE = b'"http://a.org/\\ud800x"'


@pytest.mark.parametrize(
    "path,body,headers",
    [
        ("/api/batches", b'{"urls":[%s]}' % SURROGATE, USER),
        ("/api/users", b'{"email":"a@b.org","password":%s}' % SURROGATE, {}),
        ("/api/session", b'{"email":%s,"password":"x"}' % SURROGATE, {}),
        ("/api/pages", b'{"url":%s}' % SURROGATE, USER),
        ("/api/admin/nodes", b'{"address":%s}' % SURROGATE, OPS),
        ("/api/reset", b'{"urls":[%s]}' % SURROGATE, USER),
    ],
)
def test_a_lone_surrogate_is_a_bad_request(
    client: FlaskClient, path: str, body: bytes, headers: dict[str, str]
) -> None:
    r = client.post(path, data=body, content_type="application/json", headers=headers)
    assert r.status_code == 400 and "surrogate" in r.get_json()["message"]


def test_out_of_range_ids_are_not_found_and_405_says_allow(client: FlaskClient) -> None:
    for page_id in ("0", str(2**31), "99999999999999999999"):
        assert client.get(f"/api/pages/{page_id}", headers=USER).status_code == 404
    r = client.put("/api/batches", json={})
    assert r.status_code == 405 and set(r.headers["Allow"].split(", ")) >= {"POST"}
    r = client.open("/login", method="PROPFIND")
    assert r.status_code == 405 and "POST" in r.headers["Allow"]
    r = client.delete("/")
    assert r.status_code == 405 and "GET" in r.headers["Allow"]


def test_bearer_tokens_replace_basic(client: FlaskClient) -> None:
    r = client.post("/api/tokens", json={}, headers=USER)
    assert r.status_code == 201
    bearer = {"Authorization": "Bearer " + r.get_json()["token"]}
    assert client.get("/api/pages", headers=bearer).status_code == 200
    # No CSRF token needed: a browser never adds the header on its own.
    assert (
        client.post("/api/pages", json={"url": "http://a.example/"}, headers=bearer).status_code
        == 201
    )
    forged = {"Authorization": "Bearer " + r.get_json()["token"][:-2] + "xx"}
    assert client.get("/api/pages", headers=forged).status_code == 401


# -- 10: stream slots, with the real server -----------------------------------------------------


def test_stream_slots_per_client_and_freed_on_disconnect(pg_database: str, tmp_path: Path) -> None:
    engine = make_engine(pg_database)
    upgrade(engine)
    with sessionmaker(engine).begin() as s:
        add_user(s, "ops@example.org", PASSWORD).is_admin = True
        add_user(s, "user@example.org", PASSWORD)
    engine.dispose()
    web = start_web(
        pg_database,
        tmp_path,
        {
            "JODL_WEB_THREADS": "8",
            "JODL_WEB_MAX_STREAMS": "4",
            "JODL_WEB_STREAMS_PER_CLIENT": "2",
            "JODL_WEB_OPERATOR_STREAMS": "2",
        },
    )
    auth = ("user@example.org", PASSWORD)
    try:
        r = httpx.post(
            web.url + "/api/batches", json={"urls": ["http://a.invalid/"]}, auth=auth, timeout=30
        )
        events = web.url + r.json()["events"]

        def open_streams() -> int:
            text = httpx.get(web.url + "/metrics", timeout=10).text
            line = next(x for x in text.splitlines() if x.startswith("jodl_web_streams_open "))
            return int(float(line.split()[1]))

        # One client (this address) holds at most two streams.
        held = [EventStream(events) for _ in range(2)]
        wait_for(lambda: open_streams() == 2, timeout=10, what="two streams open")
        with EventStream(events) as third:
            assert list(third) == [] and third.retry == 3000
        # Operators have their own pool, even while others' streams are open.
        ops_stream = EventStream(web.url + "/api/admin/events", auth=("ops@example.org", PASSWORD))
        first = ops_stream.next()
        assert first is not None and first.event == "status"
        # A client that goes away frees its slot within seconds.
        for s in held:
            s.close()
        ops_stream.close()
        wait_for(lambda: open_streams() == 0, timeout=5, what="the slots to be given back")
    finally:
        web.stop()


def test_stream_slots_count_per_address_whichever_accounts_it_uses(
    pg_database: str, tmp_path: Path
) -> None:
    """Issue 20, medium 6: accounts from one address share that address's streams."""
    engine = make_engine(pg_database)
    upgrade(engine)
    accounts = [(f"user{i}@example.org", PASSWORD) for i in range(3)]
    with sessionmaker(engine).begin() as s:
        for email, password in accounts:
            add_user(s, email, password)
    engine.dispose()
    web = start_web(
        pg_database,
        tmp_path,
        {
            "JODL_WEB_THREADS": "8",
            "JODL_WEB_MAX_STREAMS": "4",
            "JODL_WEB_STREAMS_PER_CLIENT": "2",
            "JODL_WEB_OPERATOR_STREAMS": "2",
        },
    )
    streams: list[EventStream] = []
    try:
        r = httpx.post(
            web.url + "/api/batches",
            json={"urls": ["http://a.invalid/"]},
            auth=accounts[0],
            timeout=30,
        )
        events = web.url + r.json()["events"]

        def open_streams() -> int:
            text = httpx.get(web.url + "/metrics", timeout=10).text
            line = next(x for x in text.splitlines() if x.startswith("jodl_web_streams_open "))
            return int(float(line.split()[1]))

        # Two accounts at 127.0.0.2 hold that address's two streams...
        for account in accounts[:2]:
            streams.append(EventStream(events, auth=account, local_address="127.0.0.2"))
        wait_for(lambda: open_streams() == 2, timeout=10, what="two streams open")
        # ...so a third account there is told to retry, though it holds none itself.
        busy = EventStream(events, auth=accounts[2], local_address="127.0.0.2", timeout=10)
        with busy as third:
            assert list(third) == [] and third.retry == 3000
        # The same account from another address gets its stream.
        streams.append(EventStream(events, auth=accounts[2], local_address="127.0.0.3"))
        wait_for(lambda: open_streams() == 3, timeout=10, what="the other address's stream")
    finally:
        for stream in streams:
            stream.close()
        web.stop()
