"""The HTML views through Flask's test client: accounts, CSRF, access, escaping, bad input.

Escaping is checked on the parsed page, not on strings: whatever a fetched page,
a URL, a selector or an error message contains (the XSS corpus below), the
rendered document has no script but the app's own file, no event-handler
attribute, no ``javascript:`` link and no element the templates do not make.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lxml.html
import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker

from crawler_app.models import CycleRequest, Page, Snapshot, User, compress
from crawler_app.users.pages import add_user, track
from jodl.log import Store, make_engine
from jodl.log.migrate import upgrade
from jodl.log.models import RunState
from web.app import create_app
from web.settings import WebSettings

PASSWORD = "correct horse battery"

#: Hostile text as it may come from a fetched page, a URL, a selector or an error.
XSS = [
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "'><svg/onload=alert(1)>",
    "</textarea><script>alert('t')</script>",
    "</pre><script>alert('p')</script>",
    "<iframe src=javascript:alert(1)></iframe>",
    '<a href="javascript:alert(1)">click</a>',
    "<style>body{display:none}</style>",
    "{{ 7*7 }}{% if 1 %}X{% endif %}",
    "&lt;script&gt;alert(1)&lt;/script&gt;",
    "\u2028<script>alert(2)</script>\u2029",
    "<body onload=alert(1)>",
    "<math><mi xlink:href=javascript:alert(1)>x</mi></math>",
]
XSS_TEXT = "\n".join(XSS)

#: Elements the templates make; anything else in a page came from data.
ALLOWED_TAGS = {
    "html", "head", "meta", "title", "link", "script", "body", "header", "nav", "main", "a",
    "div", "span", "form", "input", "button", "label", "textarea", "p", "h1", "h2", "table",
    "thead", "tbody", "tr", "th", "td", "code", "pre", "ul", "li", "br", "progress", "time",
    "del", "ins", "select", "option", "details", "summary",
}  # fmt: skip


def assert_safe(html: str) -> lxml.html.HtmlElement:
    """The document has only the app's markup: no injected script, handler or element."""
    doc = lxml.html.document_fromstring(html)
    for el in doc.iter():
        if not isinstance(el.tag, str):
            continue
        assert el.tag in ALLOWED_TAGS, f"unexpected <{el.tag}> element"
        for name, value in el.attrib.items():
            assert not name.lower().startswith("on"), f"event handler {name}={value!r}"
            if name.lower() in ("href", "src", "action", "formaction", "data", "xlink:href"):
                assert "javascript:" not in value.lower().replace(" ", ""), f"{name}={value!r}"
            assert name.lower() != "style", "inline style attribute"
    scripts = doc.xpath("//script")
    assert [s.get("src") for s in scripts] == ["/static/app.js"]
    assert all(not (s.text or "").strip() for s in scripts)
    assert not doc.xpath("//style")
    return doc


def text_of(doc: lxml.html.HtmlElement) -> str:
    return str(doc.text_content())


@pytest.fixture
def app(tmp_path: Path) -> Iterator[Flask]:
    url = f"sqlite:///{tmp_path / 'web.db'}"
    engine = make_engine(url)
    upgrade(engine)
    settings = WebSettings(
        database_url=url,
        web_secure_cookies=False,
        web_submit_burst=1000,
        web_anonymous_submit=True,
        web_anonymous_burst=1000,
        web_anonymous_batch_max=100,
    )
    application = create_app(settings, engine=engine)
    application.testing = True
    yield application
    engine.dispose()


def make_user(app: Flask, email: str, admin: bool = False) -> None:
    sessions = sessionmaker(app.extensions["jodl"].engine)
    with sessions.begin() as s:
        user = add_user(s, email, PASSWORD)
        user.is_admin = admin


def token(client: FlaskClient, path: str = "/") -> str:
    """The CSRF token from a form of ``path``."""
    html = client.get(path).get_data(as_text=True)
    found = re.search(r'name="csrf_token" value="([^"]+)"', html)
    assert found, f"no CSRF token on {path}"
    return found.group(1)


def login(client: FlaskClient, email: str) -> None:
    r = client.post(
        "/login", data={"email": email, "password": PASSWORD, "csrf_token": token(client, "/login")}
    )
    assert r.status_code == 303, r.get_data(as_text=True)


@pytest.fixture
def client(app: Flask) -> FlaskClient:
    return app.test_client()


@pytest.fixture
def user_client(app: Flask) -> FlaskClient:
    make_user(app, "user@example.org")
    c = app.test_client()
    login(c, "user@example.org")
    return c


@pytest.fixture
def admin_client(app: Flask) -> FlaskClient:
    make_user(app, "ops@example.org", admin=True)
    c = app.test_client()
    login(c, "ops@example.org")
    return c


# -- accounts ---------------------------------------------------------------------------------


def test_signup_login_logout(client: FlaskClient) -> None:
    t = token(client, "/signup")
    form = {"email": "New@Example.org", "password": PASSWORD, "confirm": PASSWORD, "csrf_token": t}
    r = client.post("/signup", data=form)
    assert r.status_code == 303 and r.headers["Location"] == "/login"
    assert "we sent a link to confirm it" in client.get("/login").get_data(as_text=True)
    # The same address again: the same answer (nothing tells that it has an account).
    t = token(client, "/signup")
    again = client.post("/signup", data={**form, "csrf_token": t})
    assert again.status_code == 303 and again.headers["Location"] == "/login"
    # A short password, two different passwords: refused, said why.
    for data, why in [
        (
            {
                **form,
                "email": "b@example.org",
                "password": "short",
                "confirm": "short",
                "csrf_token": t,
            },
            "at least 8",
        ),
        (
            {**form, "email": "c@example.org", "confirm": "other password", "csrf_token": t},
            "differ",
        ),
        ({**form, "email": "not an address", "csrf_token": t}, "not an e-mail"),
    ]:
        r = client.post("/signup", data=data)
        assert r.status_code == 400 and why in r.get_data(as_text=True)
    # Log in, a wrong password, log out.
    bad = client.post(
        "/login", data={"email": "new@example.org", "password": "nope", "csrf_token": t}
    )
    assert bad.status_code == 401 and "Wrong e-mail or password" in bad.get_data(as_text=True)
    login(client, "new@example.org")
    assert client.get("/pages").status_code == 200
    r = client.post("/logout", data={"csrf_token": token(client, "/pages")})
    assert r.status_code == 303
    assert client.get("/pages").status_code == 302


def test_password_hashes_are_salted(app: Flask) -> None:
    make_user(app, "a@example.org")
    make_user(app, "b@example.org")
    from sqlalchemy import select

    from crawler_app.models import User

    with sessionmaker(app.extensions["jodl"].engine)() as s:
        hashes = list(s.scalars(select(User.password_hash)))
    assert len(set(hashes)) == 2 and all(PASSWORD not in h for h in hashes)
    assert all(h.startswith(("scrypt:", "pbkdf2:")) for h in hashes)


def test_login_redirects_only_to_this_site(app: Flask, client: FlaskClient) -> None:
    make_user(app, "u@example.org")
    for target, expected in [
        ("/pages", "/pages"),
        ("//evil.example/x", "/"),
        ("https://evil.example/", "/"),
        ("/\\evil.example", "/"),
        ("javascript:alert(1)", "/"),
    ]:
        t = token(client, "/login")
        r = client.post(
            "/login",
            data={"email": "u@example.org", "password": PASSWORD, "csrf_token": t, "next": target},
        )
        assert r.headers["Location"] == expected, target
        client.post("/logout", data={"csrf_token": token(client, "/")})


def test_session_cookie_flags(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    engine = make_engine(url)
    upgrade(engine)
    app = create_app(WebSettings(database_url=url, web_secure_cookies=True), engine=engine)
    r = app.test_client().get("/", base_url="https://localhost")
    cookie = r.headers["Set-Cookie"]
    assert cookie.startswith("__Host-jodl=")
    for flag in ("Secure", "HttpOnly", "SameSite=Lax", "Path=/"):
        assert flag in cookie
    assert "Strict-Transport-Security" in r.headers


# -- CSRF and access -------------------------------------------------------------------------------


def test_every_state_changing_form_needs_the_csrf_token(
    app: Flask, admin_client: FlaskClient
) -> None:
    good = token(admin_client, "/")
    posts = [
        ("/batches", {"urls": "http://example.org/"}),
        ("/reset", {"urls": "http://example.org/"}),
        ("/pages", {"url": "http://example.org/"}),
        ("/pages/1/remove", {}),
        ("/admin/nodes", {"address": "127.0.0.1:9", "slots": "1"}),
        ("/admin/nodes/remove", {"address": "127.0.0.1:9"}),
        ("/admin/nodes/drain", {"address": "127.0.0.1:9"}),
        ("/admin/nodes/reload", {"address": "127.0.0.1:9"}),
        ("/admin/cycle", {}),
        ("/admin/runs/1/cancel", {}),
        ("/login", {"email": "ops@example.org", "password": PASSWORD}),
        ("/signup", {"email": "x@example.org", "password": PASSWORD, "confirm": PASSWORD}),
        ("/logout", {}),
    ]
    for path, data in posts:
        for bad in (None, "", "wrong-token", good[:-1]):
            form = dict(data) if bad is None else {**data, "csrf_token": bad}
            r = admin_client.post(path, data=form)
            assert r.status_code == 403, (path, bad)
            assert "did not come from this site" in r.get_data(as_text=True)
    # Another browser's token is no good either.
    other = app.test_client()
    r = other.post("/batches", data={"urls": "http://example.org/", "csrf_token": good})
    assert r.status_code == 403
    # With its own token the same request goes through.
    r = admin_client.post("/batches", data={"urls": "http://example.org/", "csrf_token": good})
    assert r.status_code == 303


def test_access_rules(
    client: FlaskClient, user_client: FlaskClient, admin_client: FlaskClient
) -> None:
    for path in ("/pages", "/reset", "/pages/1", "/admin/"):
        r = client.get(path)
        assert r.status_code == 302 and r.headers["Location"].startswith("/login?next=")
    for path in ("/admin/", "/admin/runs/1", "/admin/events"):
        assert user_client.get(path).status_code == 403
    assert admin_client.get("/admin/").status_code == 200
    assert admin_client.get("/admin/runs/1").status_code == 404
    # Someone else's tracked page is not yours to see or remove.
    assert user_client.get("/pages/1").status_code == 404


def test_start_a_cycle_records_a_request(
    app: Flask, user_client: FlaskClient, admin_client: FlaskClient
) -> None:
    engine = app.extensions["jodl"].engine

    def requests() -> list[tuple[int | None, object]]:
        with sessionmaker(engine)() as s:
            return [(r.user_id, r.taken_at) for r in s.scalars(select(CycleRequest))]

    r = user_client.post("/admin/cycle", data={"csrf_token": token(user_client)})
    assert r.status_code == 403
    r = admin_client.post("/admin/cycle", data={"csrf_token": "forged"})
    assert r.status_code == 403
    assert requests() == []
    r = admin_client.post("/admin/cycle", data={"csrf_token": token(admin_client)})
    assert r.status_code == 303
    with sessionmaker(engine)() as s:
        ops = s.scalar(select(User.id).where(User.email == "ops@example.org"))
    assert requests() == [(ops, None)]
    page = admin_client.get(r.headers["Location"]).get_data(as_text=True)
    assert "cycle requested" in page
    listed = lxml.html.fromstring(page).get_element_by_id("cycle-requests").text_content()
    assert "requested by ops@example.org" in listed


def test_the_cancel_button_of_a_running_run(
    app: Flask, user_client: FlaskClient, admin_client: FlaskClient
) -> None:
    store = Store(app.extensions["jodl"].engine)
    run, _ = store.open_run(store.ensure_family("mark"), 0)
    page = admin_client.get(f"/admin/runs/{run.id}").get_data(as_text=True)
    form = lxml.html.fromstring(page).xpath("//form[contains(@action, '/cancel')]")
    assert [f.get("action") for f in form] == [f"/admin/runs/{run.id}/cancel"]
    r = user_client.post(form[0].get("action"), data={"csrf_token": token(user_client)})
    assert r.status_code == 403
    r = admin_client.post(form[0].get("action"), data={"csrf_token": token(admin_client)})
    assert r.status_code == 303  # no master runs: cancelled at once
    assert store.reads.run(run.id).state == RunState.CANCELLED
    page = admin_client.get(r.headers["Location"]).get_data(as_text=True)
    assert f"run mark#{run.number} cancelled" in page
    assert "/cancel" not in page  # no button on a run that ended


# -- flows --------------------------------------------------------------------------------------


def test_submit_shows_batch_page(client: FlaskClient) -> None:
    t = token(client)
    r = client.post(
        "/batches",
        data={
            "urls": "http://a.example/\nftp://b.example/\n\n http://a.example/ ",
            "csrf_token": t,
        },
    )
    assert r.status_code == 303
    page = client.get(r.headers["Location"])
    doc = assert_safe(page.get_data(as_text=True))
    rows = doc.xpath("//tbody/tr")
    assert [row.get("id") for row in rows] == ["item-0", "item-1"]
    state = doc.get_element_by_id("batch-state")
    assert state.get("data-events").endswith("/events")
    # Too many URLs, or none: the form comes back with the reason.
    many = "\n".join(f"http://a.example/{i}" for i in range(101))
    r = client.post("/batches", data={"urls": many, "csrf_token": t})
    assert r.status_code == 400 and "at most 100" in r.get_data(as_text=True)
    r = client.post("/batches", data={"urls": "  \n ", "csrf_token": t})
    assert r.status_code == 400 and "no URL" in r.get_data(as_text=True)


def test_reset_form(user_client: FlaskClient) -> None:
    t = token(user_client, "/reset")
    r = user_client.post(
        "/reset", data={"urls": "http://a.example/\n<script>alert(1)</script>", "csrf_token": t}
    )
    assert r.status_code == 200
    doc = assert_safe(r.get_data(as_text=True))
    assert "refused: <script>alert(1)</script>" in text_of(doc)


def test_track_and_untrack(user_client: FlaskClient) -> None:
    t = token(user_client, "/pages")
    r = user_client.post(
        "/pages", data={"url": "http://news.example/", "selector": "main .item", "csrf_token": t}
    )
    assert r.status_code == 303
    html = user_client.get("/pages").get_data(as_text=True)
    doc = assert_safe(html)
    assert "http://news.example/" in text_of(doc) and "main .item" in text_of(doc)
    for url, selector, why in [
        ("javascript:alert(1)", "", "not allowed"),
        ("http://news.example/", "p[[[", "selector"),
        ("", "", "address of the page"),
    ]:
        r = user_client.post("/pages", data={"url": url, "selector": selector, "csrf_token": t})
        assert r.status_code == 400
        assert why in text_of(assert_safe(r.get_data(as_text=True)))
    page_id = re.search(r"/pages/(\d+)/remove", html).group(1)  # type: ignore[union-attr]
    r = user_client.post(f"/pages/{page_id}/remove", data={"csrf_token": t})
    assert r.status_code == 303
    assert "You track no page yet" in user_client.get("/pages").get_data(as_text=True)


# -- escaping -----------------------------------------------------------------------------------


def hostile_page(app: Flask, email: str) -> int:
    """A tracked page whose title, error, selector and two snapshots are hostile text."""
    sessions = sessionmaker(app.extensions["jodl"].engine, expire_on_commit=False)
    with sessions.begin() as s:
        tracking = track(s, email, "http://evil.example/<x>", selector="p")
        page = s.get(Page, tracking.page_id)
        assert page is not None
        page.title = XSS[1]
        page.last_error = XSS[0]
        # Every line differs, so every hostile line shows in both kinds of diff.
        old_text = "\n".join("old " + x for x in XSS)
        new_text = "\n".join("new " + x for x in XSS)
        for kind, text in (("baseline", old_text), ("change", new_text)):
            s.add(
                Snapshot(
                    page_id=page.id,
                    selector="p",
                    kind=kind,
                    fingerprint=kind,
                    text_z=compress(text),
                    chars=len(text),
                    status=200,
                )
            )
        return page.id


def test_hostile_text_is_escaped_everywhere(app: Flask, user_client: FlaskClient) -> None:
    page_id = hostile_page(app, "user@example.org")
    listing = assert_safe(user_client.get("/pages").get_data(as_text=True))
    assert XSS[1] in text_of(listing) and XSS[0] in text_of(listing)
    for mode in ("inline", "side"):
        r = user_client.get(f"/pages/{page_id}?mode={mode}")
        assert r.status_code == 200
        doc = assert_safe(r.get_data(as_text=True))
        shown = text_of(doc)
        for payload in XSS:
            assert payload.strip("\u2028\u2029") in shown, (mode, payload)
        assert "new {{ 7*7 }}{% if 1 %}X{% endif %}" in shown  # no template evaluation
    side = assert_safe(user_client.get(f"/pages/{page_id}?mode=side").get_data(as_text=True))
    assert side.xpath("//table[@id='diff-side']//tr[@class='add' or @class='change']")
    inline = assert_safe(user_client.get(f"/pages/{page_id}").get_data(as_text=True))
    assert inline.xpath("//table[@id='diff-inline']//tr[@class='add']//ins")


def test_admin_page_escapes_node_errors(app: Flask, admin_client: FlaskClient) -> None:
    store = app.extensions["jodl"].store
    node = store.add_node("127.0.0.1:9", slots=2)
    store.update_node(node.id, last_error=XSS[0] + XSS[1])
    doc = assert_safe(admin_client.get("/admin/").get_data(as_text=True))
    assert XSS[0] + XSS[1] in text_of(doc)


def test_templates_have_no_inline_script_or_style() -> None:
    root = Path(__file__).resolve().parent.parent / "web" / "templates"
    for path in root.glob("*.html"):
        text = path.read_text()
        assert not re.search(r"<script(?![^>]*\bsrc=)", text), path.name
        assert not re.search(r"\sstyle=|<style|\son[a-z]+=", text), path.name
        assert "|safe" not in text and "autoescape false" not in text, path.name


# -- headers and bad input ------------------------------------------------------------------------


def test_security_headers_on_every_kind_of_response(client: FlaskClient) -> None:
    for path in ("/", "/nope", "/static/app.css", "/api/openapi.json", "/healthz", "/metrics"):
        r = client.get(path)
        csp = r.headers["Content-Security-Policy"]
        assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.headers["X-Frame-Options"] == "DENY"
        assert r.headers["Referrer-Policy"] == "same-origin"
    assert client.post("/batches", data={}).headers["Content-Security-Policy"]


def test_malformed_input_never_gives_500(
    app: Flask, user_client: FlaskClient, admin_client: FlaskClient
) -> None:
    page_id = hostile_page(app, "user@example.org")
    t = token(user_client, "/pages")
    at = token(admin_client, "/admin/")
    gets: list[str] = [
        "/pages/99999999999999999999999",
        "/pages/-1",
        "/pages/abc",
        f"/pages/{page_id}?a=1e309&b=x",
        f"/pages/{page_id}?a=99999999999999999999999",
        f"/pages/{page_id}?a=-5&mode=<script>",
        f"/pages/{page_id}?mode=%00%ff",
        "/batches/" + "x" * 5000,
        "/batches/%ff%fe",
        "/batches/../../etc/passwd",
        "/batches/a/events?last_event_id=%00%ff" + "9" * 500,
        "/login?next=%00%0d%0aSet-Cookie:x=y",
        "/admin/runs/99999999999999999999",
        "/static/../setup.cfg",
    ]
    for path in gets:
        for c in (user_client, admin_client):
            r = c.get(path)
            assert r.status_code < 500, (path, r.status_code)
    posts: list[tuple[FlaskClient, str, Any]] = [
        (user_client, "/batches", {"urls": "\x00\u202e\ufeff" * 50, "csrf_token": t}),
        (user_client, "/batches", {"urls": "http://" + "a" * 5000, "csrf_token": t}),
        (user_client, "/batches", {"urls": ["a", "b"], "csrf_token": t}),
        (
            user_client,
            "/pages",
            {"url": "http://x.example/" + "a" * 5000, "selector": "p" * 5000, "csrf_token": t},
        ),
        (
            user_client,
            "/pages",
            {"url": "http://x.example/", "selector": "\x00<>", "csrf_token": t},
        ),
        (user_client, "/reset", {"urls": "x" * 100_000, "csrf_token": t}),
        (
            user_client,
            "/login",
            {"email": "\x00" * 1000, "password": "p" * 10_000, "csrf_token": t},
        ),
        (
            user_client,
            "/signup",
            {"email": "a@b.c" * 500, "password": "x", "confirm": "y", "csrf_token": t},
        ),
        (user_client, "/pages/99999999999999999999/remove", {"csrf_token": t}),
        (admin_client, "/admin/nodes", {"address": "not an address", "csrf_token": at}),
        (
            admin_client,
            "/admin/nodes",
            {"address": "127.0.0.1:9", "slots": "lots", "csrf_token": at},
        ),
        (admin_client, "/admin/nodes", {"address": "127.0.0.1:9", "slots": "0", "csrf_token": at}),
        (admin_client, "/admin/nodes", {"address": "h\x00:1" + "9" * 300, "csrf_token": at}),
        (admin_client, "/admin/nodes/remove", {"address": "x" * 1000, "csrf_token": at}),
        (admin_client, "/admin/cycle", {"csrf_token": at}),
    ]
    for c, path, data in posts:
        r = c.post(path, data=data)
        assert r.status_code < 500, (path, r.status_code)
    big = user_client.post("/batches", data={"urls": "x" * (2 * 1024 * 1024), "csrf_token": t})
    assert big.status_code == 413
    for raw_body in (b"\xff\xfe%%%=&&=\x00", f"csrf_token={t}&urls=%ED%A0%80%FF%00".encode()):
        raw = user_client.post(
            "/batches", data=raw_body, content_type="application/x-www-form-urlencoded"
        )
        assert raw.status_code < 500
    odd = user_client.post(
        "/batches", data=b"--x\r\n", content_type="multipart/form-data; boundary=x"
    )
    assert odd.status_code < 500


# -- diffs people read ----------------------------------------------------------------------------


def page_with_history(app: Flask, email: str, texts: list[str]) -> tuple[int, list[int]]:
    """A tracked page with one snapshot per text, oldest first; its id and the snapshots'."""
    sessions = sessionmaker(app.extensions["jodl"].engine, expire_on_commit=False)
    ids = []
    with sessions.begin() as s:
        tracking = track(s, email, "http://shop.example/item", selector="p")
        for n, text in enumerate(texts):
            snap = Snapshot(
                page_id=tracking.page_id,
                selector="p",
                kind="baseline" if n == 0 else "change",
                fingerprint=str(n),
                text_z=compress(text),
                chars=len(text),
                status=200,
            )
            s.add(snap)
            s.flush()
            ids.append(snap.id)
        return tracking.page_id, ids


def test_changed_words_are_marked_within_changed_lines(
    app: Flask, user_client: FlaskClient
) -> None:
    texts = [
        "Blue kettle\nPrice: 10 EUR, in stock\nShips in 2 days",
        "Blue kettle\nPrice: 12 EUR, in stock\nShips in 2 days",
        "Blue kettle\nPrice: 12 EUR, sold out\nShips in 2 days",
    ]
    page_id, (first, second, third) = page_with_history(app, "user@example.org", texts)
    doc = assert_safe(user_client.get(f"/pages/{page_id}").get_data(as_text=True))
    # The newest two by default: only "in stock" -> "sold out" is marked, not the line.
    assert [d.text_content() for d in doc.xpath("//table[@id='diff-inline']//del")] == ["in stock"]
    assert [i.text_content() for i in doc.xpath("//table[@id='diff-inline']//ins")] == ["sold out"]
    removed = doc.xpath("//table[@id='diff-inline']//tr[@class='remove']/td[@class='text']")
    assert [r.text_content() for r in removed] == ["Price: 12 EUR, in stock"]
    shown = text_of(doc)
    assert "@@" not in shown and "+++" not in shown and "---" not in shown
    # Any two snapshots: the history's form offers every one on both sides.
    form = doc.xpath("//form[@id='compare']")[0]
    for name in ("a", "b"):
        options = form.xpath(f".//select[@name='{name}']/option/@value")
        assert sorted(int(v) for v in options) == [first, second, third]
    side = assert_safe(
        user_client.get(f"/pages/{page_id}?a={first}&b={third}&mode=side").get_data(as_text=True)
    )
    (row,) = side.xpath("//table[@id='diff-side']//tr[@class='change']")
    assert [d.text_content() for d in row.xpath(".//del")] == ["10", "in stock"]
    assert [i.text_content() for i in row.xpath(".//ins")] == ["12", "sold out"]
    assert row.xpath("./td[@class='no']/text()") == ["2", "2"]


# -- a run's jobs ------------------------------------------------------------------------------


def test_a_runs_page_lists_its_jobs_filtered_and_paged(
    app: Flask, admin_client: FlaskClient, user_client: FlaskClient
) -> None:
    """A real cycle on an in-process agent: every job fails once, then succeeds."""
    from jodl.agent.local import start_agent
    from jodl.master import Master
    from jodl.settings.config import Settings

    engine = app.extensions["jodl"].engine
    store = Store(engine)
    settings = Settings.from_env(env={}, database_url=str(engine.url), call_timeout=5.0)
    agent = start_agent(settings.replace(secret=None, agent_slots=3), "local:1")
    family = store.ensure_family("flaky")
    store.add_jobs(family, ((f"job-{i:02d}", f'{{"key": "job-{i:02d}"}}') for i in range(60)))
    store.add_node("local:1", slots=3)
    master = Master(settings.replace(secret=None, max_attempts=3), store=store)
    try:
        summary = master.run_cycle("flaky")
    finally:
        master.close()
        agent.close()
    assert (summary.total, summary.done) == (60, 60)

    def listed(query: str) -> tuple[list[tuple[str, str, str]], str | None]:
        doc = assert_safe(
            admin_client.get(f"/admin/runs/{summary.run_id}{query}").get_data(as_text=True)
        )
        rows = [
            tuple(td.text_content().strip() for td in tr.xpath("./td"))
            for tr in doc.xpath("//table[@id='jobs']/tbody/tr")
        ]
        nxt = doc.xpath("//a[@id='jobs-next']/@href")
        return [(r[0], r[3], r[6]) for r in rows], (nxt[0] if nxt else None)

    # All 120 attempts, 50 a page, in the order they were logged.
    seen: list[tuple[str, str, str]] = []
    query: str | None = ""
    while query is not None:
        rows, href = listed(query)
        seen += rows
        query = href.partition("?")[1] + href.partition("?")[2] if href else None
    assert len(seen) == 120
    assert sorted(k for k, state, _ in seen if state == "failed") == [
        f"job-{i:02d}" for i in range(60)
    ]
    assert all("fails on purpose" in text for _, state, text in seen if state == "failed")
    assert all(text == '{"attempt":2}' for _, state, text in seen if state == "done")
    # Filtered by state and by part of the key.
    rows, href = listed("?state=done&key=job-1")
    assert sorted(k for k, _, _ in rows) == [f"job-1{i}" for i in range(10)]
    assert {state for _, state, _ in rows} == {"done"} and href is None
    # The same through the API, with its cursor; bad input is one clear 400.
    api = admin_client.get(f"/api/admin/runs/{summary.run_id}/jobs?state=failed&limit=40")
    data = api.get_json()
    assert len(data["jobs"]) == 40 and data["next"] == data["jobs"][-1]["exec_id"]
    rest = admin_client.get(
        f"/api/admin/runs/{summary.run_id}/jobs?state=failed&limit=40&after={data['next']}"
    ).get_json()
    assert len(rest["jobs"]) == 20 and rest["next"] is None
    assert {j["node"] for j in data["jobs"] + rest["jobs"]} == {"local:1"}
    bad = admin_client.get(f"/api/admin/runs/{summary.run_id}/jobs?state=nosuch")
    assert bad.status_code == 400 and "state: one of" in str(bad.get_json())
    assert admin_client.get("/api/admin/runs/999999/jobs").status_code == 404
    assert user_client.get(f"/api/admin/runs/{summary.run_id}/jobs").status_code == 403
