"""Who asked decides what a fetch may reach (docs/security.md, "Fetching").

Real agents whose ``JODL_FETCH_ALLOW`` admits 127.0.0.0/8 (as the README's trial
advice did), a serving master, the web app through Flask's test client and a
local site holding an "intranet" page. Only ``ann`` is named in
``JODL_FETCH_ALLOW_USERS``; ``bob`` is signed in too; visitors are anonymous.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from agents import wait_for
from app_support import app_settings, run_app_cycle
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker
from webserver import AGENT_ENV, ServingMaster

from crawler_app.fetching.fetcher import NOT_FOR_THIS_JOB, Fetcher, FetchFailed, FetchSettings
from crawler_app.fetching.reach import AllowUsers, Reach
from crawler_app.models import Page
from crawler_app.settings import AppSettings
from crawler_app.users import pages
from jodl.exceptions import ConfigError
from jodl.log.models import Job
from web.app import create_app
from web.settings import WebSettings

if TYPE_CHECKING:
    from tests.site import TestSite

pytest_plugins = ("tests.site",)

PASSWORD = "correct horse battery"
ALLOWED = "ann@example.org"
OTHER = "bob@example.org"
SECRET = "<html><body><p>intranet secret</p></body></html>"


def basic(email: str) -> dict[str, str]:
    raw = base64.b64encode(f"{email}:{PASSWORD}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


def make_app(store: Any, db_url: str) -> Flask:
    settings = WebSettings(
        database_url=db_url,
        web_secure_cookies=False,
        web_anonymous_submit=True,
        web_submit_burst=1000,
        web_anonymous_burst=1000,
    )
    return create_app(settings, engine=store.engine)


@dataclass
class Cluster:
    app: Flask
    client: FlaskClient
    served: ServingMaster

    def answers(self, batch_id: str, timeout: float = 60.0) -> list[dict[str, Any]]:
        """The batch's events once every URL is answered."""

        def complete() -> dict[str, Any] | None:
            got = self.client.get(f"/api/batches/{batch_id}").get_json()
            return got if got["complete"] else None

        return list(wait_for(complete, timeout, "the batch's answers")["results"])

    def submit_as_queued(self, url: str, reach: Reach) -> str:
        """Queue ``url`` as the web does once its early check passed: for a name that
        resolved to a public address for the web and to loopback for the agent (DNS
        rebinding), the agent's guard is the only check left."""
        batches = self.app.extensions["jodl"].batches
        submitted = batches.submit([url], None, reach=reach)
        assert submitted.queued == 1
        return submitted.id


@pytest.fixture
def cluster(store, agents, settings, db_url, monkeypatch) -> Iterator[Cluster]:
    monkeypatch.setenv("JODL_FETCH_ALLOW_USERS", ALLOWED)
    agents(1, env=AGENT_ENV)
    with sessionmaker(store.engine).begin() as s:
        pages.add_user(s, ALLOWED, PASSWORD)
        pages.add_user(s, OTHER, PASSWORD)
    app = make_app(store, db_url)
    served = ServingMaster(settings, store).start()
    try:
        yield Cluster(app, app.test_client(), served)
    finally:
        served.stop()


def payloads(store, url: str) -> dict[str, dict[str, Any]]:
    """Job key -> payload of the jobs whose key ends with ``url``."""
    with sessionmaker(store.engine)() as s:
        rows = s.execute(select(Job.key, Job.payload).where(Job.key.like(f"%{url}"))).all()
    return {key: json.loads(payload) for key, payload in rows}


def test_an_anonymous_job_is_refused_loopback_the_agents_allowlist_admits(
    cluster: Cluster, site: TestSite, store
) -> None:
    site.set_page("/secret", SECRET)
    url = site.url("/secret")
    # The web's early check refuses a loopback address at once...
    r = cluster.client.post("/api/batches", json={"urls": [url]})
    [item] = r.get_json()["items"]
    assert item["answer"] == "refused" and "log in" in item["error"]
    # ...and the job of a URL it admitted cannot use the allowlist on the agent.
    [event] = cluster.answers(cluster.submit_as_queued(url, Reach.PUBLIC))
    assert event["ok"] is False and event["excerpt"] is None
    assert event["error"].startswith("refused:") and "JODL_FETCH_ALLOW_USERS" in event["error"]
    assert site.requests("/secret") == []
    [(key, payload)] = payloads(store, url).items()
    assert key == "web:" + url and payload["reach"] == "public"


def test_an_anonymous_jobs_redirect_to_loopback_is_refused(
    cluster: Cluster, make_site, store
) -> None:
    # No public server can run here: the first hop is on loopback too (refused as well);
    # what counts is that neither hop is read for the visitor and both are for ann.
    front, intranet = make_site("127.0.0.1"), make_site("127.0.0.3")
    intranet.set_page("/secret", SECRET)
    front.set_redirect("/go", intranet.url("/secret"))
    [event] = cluster.answers(cluster.submit_as_queued(front.url("/go"), Reach.PUBLIC))
    assert event["ok"] is False and event["error"].startswith("refused:")
    assert intranet.requests() == [] and front.requests("/go") == []
    r = cluster.client.post(
        "/api/batches", json={"urls": [front.url("/go")]}, headers=basic(ALLOWED)
    )
    [event] = cluster.answers(r.get_json()["id"])
    assert event["ok"] is True and event["final_url"] == intranet.url("/secret")
    assert "intranet secret" in event["excerpt"]


def test_a_user_named_in_the_setting_reads_the_loopback_page(
    cluster: Cluster, site: TestSite, store
) -> None:
    site.set_page("/secret", SECRET)
    url = site.url("/secret")
    r = cluster.client.post("/api/batches", json={"urls": [url]}, headers=basic(ALLOWED))
    assert r.get_json()["queued"] == 1
    [event] = cluster.answers(r.get_json()["id"])
    assert event["ok"] is True and "intranet secret" in event["excerpt"]
    [(key, payload)] = payloads(store, url).items()
    assert key == "web-allowlist:" + url and payload["reach"] == "allowlist"
    # Ann's cached result never answers a visitor: the visitor's job is its own, refused.
    [event] = cluster.answers(cluster.submit_as_queued(url, Reach.PUBLIC))
    assert event["ok"] is False and event["cached"] is False and event["excerpt"] is None
    assert len(site.requests("/secret")) == 1


def test_a_signed_in_user_not_named_in_the_setting_is_refused(
    cluster: Cluster, site: TestSite
) -> None:
    site.set_page("/secret", SECRET)
    r = cluster.client.post(
        "/api/batches", json={"urls": [site.url("/secret")]}, headers=basic(OTHER)
    )
    [item] = r.get_json()["items"]
    assert item["answer"] == "refused" and "JODL_FETCH_ALLOW_USERS" in item["error"]
    assert "127.0.0.1" not in item["error"]
    # Operators are not named either: the setting says ann only.
    assert AppSettings.from_env().allow_users().reach(OTHER, is_admin=True) is Reach.PUBLIC
    assert site.requests("/secret") == []


def test_localhost_with_a_trailing_dot_is_refused_for_visitors(store, db_url) -> None:
    app = make_app(store, db_url)
    client = app.test_client()
    urls = ["http://localhost.:9/secret", "http://LocalHost./", "http://intranet.localhost/"]
    items = client.post("/api/batches", json={"urls": urls}).get_json()["items"]
    assert [i["answer"] for i in items] == ["refused"] * 3
    for item in items:
        assert "not a public address: log in" in item["error"]


def test_a_tracked_page_uses_the_allowlist_when_one_of_its_trackers_may(
    store, agents, settings, make_site
) -> None:
    agents(1, env=AGENT_ENV)
    shared, own = make_site("127.0.0.1"), make_site("127.0.0.4")
    for page_site in (shared, own):
        page_site.set_page("/p", SECRET)
    with sessionmaker(store.engine).begin() as s:
        for email in (ALLOWED, OTHER):
            pages.add_user(s, email)
        pages.track(s, OTHER, shared.url("/p"))
        pages.track(s, ALLOWED, shared.url("/p"))
        pages.track(s, OTHER, own.url("/p"))
    result = run_app_cycle(store, settings, app_settings(fetch_allow_users=(ALLOWED,)))
    assert result.checked == 2
    with sessionmaker(store.engine)() as s:
        errors = dict(s.execute(select(Page.url, Page.last_error)).tuples().all())
    assert errors[shared.url("/p")] is None
    assert (errors[own.url("/p")] or "").startswith("refused")
    assert own.requests("/p") == [] and len(shared.requests("/p")) >= 1


def test_the_setting_is_checked_at_start_and_defaults_to_operators(
    store, db_url, monkeypatch
) -> None:
    with pytest.raises(ConfigError, match="JODL_FETCH_ALLOW_USERS: 'bob' is neither"):
        AppSettings.from_env(env={"JODL_FETCH_ALLOW_USERS": "ann@example.org, bob"})
    monkeypatch.setenv("JODL_FETCH_ALLOW_USERS", "nobody")
    with pytest.raises(ConfigError, match="JODL_FETCH_ALLOW_USERS"):
        make_app(store, db_url)
    default = AppSettings.from_env(env={}).allow_users()
    assert default == AllowUsers(operators=True)
    assert default.reach("ops@example.org", is_admin=True) is Reach.ALLOWLIST
    assert default.reach(OTHER) is Reach.PUBLIC and default.reach(None) is Reach.PUBLIC
    assert AllowUsers.parse(["*"]).reach(None) is Reach.PUBLIC  # visitors: never
    # The agent reads the reach from the payload: anything but "allowlist" is public.
    for payload in ({}, {"reach": True}, {"reach": "ALLOWLIST"}, {"reach": ["allowlist"]}):
        assert Reach.of_payload(payload) is Reach.PUBLIC
    assert Reach.of_payload({"reach": "allowlist"}) is Reach.ALLOWLIST


def test_the_fetcher_empties_the_allowlist_for_a_job_without_it(site: TestSite) -> None:
    site.set_page("/secret", SECRET)
    config = FetchSettings(allow_networks=("127.0.0.0/8",), per_host_interval=0)

    async def main() -> tuple[dict[str, Any], dict[str, Any], str]:
        async with Fetcher(config) as fetcher:
            refused = await fetcher.fetch(site.url("/secret"), use_allowlist=False)
            read = await fetcher.fetch(site.url("/secret"))
            try:  # a rendered page's request, as crawler_app.fetching.browser makes it
                await fetcher.get_resource(site.url("/secret"), {}, 1000, use_allowlist=False)
            except FetchFailed as exc:
                return refused, read, exc.code
            return refused, read, "fetched"

    refused, read, resource = asyncio.run(main())
    assert refused["error"] == "refused" and refused["error_reason"] == "blocked_address"
    assert NOT_FOR_THIS_JOB in refused["error_message"]
    assert read["ok"] is True and resource == "refused"
    assert len(site.wait_requests("/secret", 1)) == 1  # logged once its answer is written
