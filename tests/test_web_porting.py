"""Import and export in the web UI (an upload form with the CSRF token, download links)
and the API (``/api/trackings/import``, ``/api/trackings/export``, the API's auth)."""

from __future__ import annotations

import io
import json

import test_web_views
import yaml
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker
from test_porting import BAD_YAML, URLS_YAML
from test_web_api import USER, make_app
from test_web_views import assert_safe, token

from crawler_app.models import Tracking
from crawler_app.users.pages import get_user
from crawler_app.users.quota import set_quota

app = test_web_views.app
user_client = test_web_views.user_client


def tracked(application: Flask, email: str = "user@example.org") -> int:
    with sessionmaker(application.extensions["jodl"].engine)() as s:
        user = get_user(s, email)
        return s.scalar(select(func.count()).where(Tracking.user_id == user.id)) or 0


def test_the_api_imports_and_exports(tmp_path) -> None:
    application = make_app(tmp_path)
    api = application.test_client()
    # Not logged in: nothing either way.
    assert api.get("/api/trackings/export").status_code == 401
    r = api.post("/api/trackings/import", json={"text": URLS_YAML})
    assert r.status_code == 401
    r = api.post("/api/trackings/import", json={"text": URLS_YAML}, headers=USER)
    assert r.status_code == 200, r.get_json()
    answer = r.get_json()
    assert (answer["added"], answer["updated"], answer["unchanged"]) == (5, 0, 0)
    assert any("max_tries" in note for note in answer["notes"])
    # Export: our JSON (the default), or a urls.yaml.
    r = api.get("/api/trackings/export", headers=USER)
    assert r.status_code == 200 and r.mimetype == "application/json"
    doc = r.get_json()
    assert doc["format"] == "jodl-trackings" and len(doc["trackings"]) == 5
    r = api.get("/api/trackings/export?format=urlwatch", headers=USER)
    assert r.status_code == 200 and r.mimetype == "application/yaml"
    jobs = [job for job in yaml.safe_load_all(r.get_data(as_text=True)) if job]
    assert {job["url"] for job in jobs} == {p["url"] for p in doc["trackings"]}
    assert api.get("/api/trackings/export?format=csv", headers=USER).status_code == 400
    # A file with entries that cannot be mapped: 400 naming each line; nothing imported.
    before = tracked(application)
    r = api.post("/api/trackings/import", json={"text": BAD_YAML}, headers=USER)
    assert r.status_code == 400
    body = r.get_json()
    assert [p["line"] for p in body["problems"]] == [3, 8, 10]
    assert body["message"].startswith("nothing imported, 3 entries cannot be mapped")
    assert tracked(application) == before
    # Our format back in: every tracking is there already, nothing changes.
    r = api.post(
        "/api/trackings/import", json={"text": json.dumps(doc), "format": "json"}, headers=USER
    )
    assert r.get_json()["unchanged"] == 5
    # Over the quota: 403, the whole file refused.
    with sessionmaker(application.extensions["jodl"].engine).begin() as s:
        set_quota(s, get_user(s, "user@example.org"), trackings=6)
    more = "".join(f"---\nurl: https://{n}.example/\n" for n in ("a", "b"))
    r = api.post("/api/trackings/import", json={"text": more}, headers=USER)
    assert r.status_code == 403 and r.get_json()["error"] == "quota_exceeded"
    assert tracked(application) == 5
    # JSON only, as every state-changing API request.
    r = api.post("/api/trackings/import", data=URLS_YAML, headers=USER)
    assert r.status_code == 415


def test_the_api_needs_the_csrf_header_with_a_session(tmp_path) -> None:
    application = make_app(tmp_path)
    browser = application.test_client()
    r = browser.post(
        "/api/session", json={"email": "user@example.org", "password": test_web_views.PASSWORD}
    )
    assert r.status_code == 200
    r = browser.post("/api/trackings/import", json={"text": URLS_YAML})
    assert r.status_code == 403
    assert tracked(application) == 0
    csrf = {"X-CSRF-Token": browser.get("/api/session").get_json()["csrf_token"]}
    r = browser.post("/api/trackings/import", json={"text": URLS_YAML}, headers=csrf)
    assert r.status_code == 200 and tracked(application) == 5


def test_the_pages_page_imports_and_exports(app: Flask, user_client: FlaskClient) -> None:
    doc = assert_safe(user_client.get("/pages").get_data(as_text=True))
    (form,) = doc.xpath("//form[@id='import-form']")
    assert form.get("enctype") == "multipart/form-data"
    links = {a.get("id"): a.get("href") for a in doc.xpath("//a[starts-with(@id, 'export-')]")}
    assert set(links) == {"export-json", "export-urlwatch"}

    def upload(text: str, **fields: str) -> object:
        data = {"file": (io.BytesIO(text.encode()), "urls.yaml"), **fields}
        return user_client.post("/pages/import", data=data, content_type="multipart/form-data")

    # Without the session's CSRF token the form is refused, as every form.
    r = upload(URLS_YAML)
    assert r.status_code == 403 and tracked(app) == 0
    r = upload(BAD_YAML, csrf_token=token(user_client, "/pages"))
    assert r.status_code == 303 and tracked(app) == 0
    page = user_client.get("/pages").get_data(as_text=True)
    assert "Nothing imported, 3 entries cannot be mapped: line 3" in page
    r = upload(URLS_YAML, csrf_token=token(user_client, "/pages"), format="urlwatch")
    assert r.status_code == 303 and tracked(app) == 5
    assert "Imported: 5 added, 0 updated, 0 unchanged." in user_client.get("/pages").get_data(
        as_text=True
    )
    r = user_client.get(links["export-urlwatch"])
    assert r.status_code == 200 and r.mimetype == "application/yaml"
    assert r.headers["Content-Disposition"] == 'attachment; filename="urls.yaml"'
    r = user_client.get(links["export-json"])
    assert json.loads(r.data)["format"] == "jodl-trackings"
    # Not logged in: the login page, no file.
    r = app.test_client().get(links["export-json"])
    assert r.status_code == 302 and "/login" in r.headers["Location"]
