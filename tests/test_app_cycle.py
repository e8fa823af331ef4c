"""The application cycle end to end: local site, real agents, real SMTP, real database."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import lxml.html
import pytest
from agents import free_port, run_jodl
from app_support import add_users_tracking, agent_env, app_settings, inbox, run_app_cycle
from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker
from test_web_views import login, make_user, token

from crawler_app.checking.confirm import DEFAULT_CONFIRM_FETCHES
from crawler_app.checking.families import Notify
from crawler_app.checking.schedule import CycleScheduler
from crawler_app.models import (
    AppCycle,
    CycleStep,
    Notification,
    NotificationState,
    Page,
    PageView,
    Snapshot,
)
from crawler_app.notify import mail
from crawler_app.users.pages import normalise_url
from jodl.log.models import ExecState, Execution, FamilyRow, Job, JobState, Run
from jodl.master import Master
from web.app import create_app
from web.settings import WebSettings

pytest_plugins = ("tests.site",)
__all__ = ["inbox"]  # the fixture, imported for pytest


def html(title: str, *paragraphs: str, extra: str = "") -> str:
    body = "".join(f"<p>{p}</p>" for p in paragraphs)
    return (
        f"<html><head><title>{title}</title><script>var t = Math.random();</script>"
        f"<style>p {{ color: red }}</style></head><body>{body}{extra}</body></html>"
    )


def page_row(store, url: str) -> Page:
    with sessionmaker(store.engine)() as s:
        page = s.scalar(select(Page).where(Page.url == normalise_url(url)))
        assert page is not None
        s.expunge(page)
        return page


def test_a_changed_page_mails_exactly_its_trackers_once(store, agents, settings, site, inbox):
    site.set_page("/a", html("News", "first story", "second story"), headers={"ETag": '"a1"'})
    site.set_page("/b", html("Other", "nothing new"), headers={"ETag": '"b1"'})
    a, b = site.url("/a"), site.url("/b")
    add_users_tracking(store, a, ["ann@example.org", "bob@example.org"])
    add_users_tracking(store, b, ["cid@example.org"])
    # Tracks only a part of /a that does not change: no mail for this one.
    add_users_tracking(store, a, ["dan@example.org"], selector="#sidebar")
    site.set_page(
        "/a",
        html("News", "first story", "second story", extra="<div id=sidebar>links</div>"),
        headers={"ETag": '"a1"'},
    )
    agents(1, env=agent_env(inbox))

    first = run_app_cycle(store, settings)
    assert (first.checked, first.changed, first.notifications) == (2, 0, 0)
    site.set_page(
        "/a",
        html(
            "News", "first story", "a <b>brand</b> new story", extra="<div id=sidebar>links</div>"
        ),
        headers={"ETag": '"a2"'},
    )
    # Seen, fetched again to confirm it within the check, mailed in the same cycle.
    second = run_app_cycle(store, settings)
    assert (second.changed, second.notifications, second.sent) == (1, 2, 2)
    assert second.not_modified == 1  # /b
    third = run_app_cycle(store, settings)  # a 304 for ETag "a2": nothing new
    assert (third.changed, third.notifications, third.not_modified) == (0, 0, 2)

    assert inbox.per_recipient() == {"ann@example.org": 1, "bob@example.org": 1}
    mail = inbox.to("ann@example.org")[0]
    assert mail.subject == "JODL: 1 tracked page changed"
    assert a in mail.text
    assert "- second story" in mail.text
    assert "+ a brand new story" in mail.text
    assert "Math.random" not in mail.text
    assert mail.message_id.startswith(f"<digest-{second.id}-")
    assert "a brand new story" in mail.html
    # One check of /a per cycle for its three trackers: a baseline (two fetches, to learn
    # what varies), a confirmed change (the fetch and its confirming fetches), a 304.
    assert len(site.requests("/a")) == 2 + (1 + DEFAULT_CONFIRM_FETCHES) + 1
    page = page_row(store, a)
    assert page.etag == '"a2"'
    assert page.last_changed_at is not None
    assert page.title == "News"
    with sessionmaker(store.engine)() as s:
        kinds = s.execute(
            select(Snapshot.selector, Snapshot.kind).where(Snapshot.page_id == page.id)
        ).all()
        assert sorted(kinds) == [("", "baseline"), ("", "change"), ("#sidebar", "baseline")]
        # The view's model counts its good fetches (fewer confirm a change as it grows).
        model = s.scalar(
            select(PageView.model).where(PageView.page_id == page.id, PageView.selector == "")
        )
        assert model["seen"] == str(2 + 1 + DEFAULT_CONFIRM_FETCHES)
        notes = s.scalars(select(Notification)).all()
        assert {n.state for n in notes} == {NotificationState.SENT}
        # The digests' jobs never run again.
        states = s.scalars(
            select(Job.state)
            .join(FamilyRow, FamilyRow.id == Job.family_id)
            .where(FamilyRow.name == "notify")
        ).all()
        assert states == [JobState.DONE, JobState.DONE]


@pytest.mark.parametrize("strategy", ["affinity", "earliest_finish"])
def test_a_hosts_politeness_holds_across_agents(store, agents, settings, site, strategy):
    # check_page places every page of a host on one agent (affinity by host, strict):
    # two agents allowing 2 requests in flight per host still send 2 at most, all
    # from one node. An operator who switches the family to earliest_finish spreads
    # the host over both agents, each keeping its own limit.
    urls = []
    for i in range(16):
        site.set_page(f"/p{i}", html(f"Page {i}", "text"), delay=0.05)
        urls.append(site.url(f"/p{i}"))
    for url in urls:
        add_users_tracking(store, url, ["ann@example.org"])
    with store.engine.begin() as conn:
        family = conn.execute(select(FamilyRow).where(FamilyRow.name == "check_page")).one()
        assert (family.strategy, family.strategy_params) == ("affinity", {"by": "host"})
        if strategy != "affinity":
            conn.execute(
                FamilyRow.__table__.update()
                .where(FamilyRow.name == "check_page")
                .values(strategy=strategy, strategy_params={})
            )
    agents(2, env={**agent_env(), "JODL_FETCH_HOST_IN_FLIGHT": "2"})

    result = run_app_cycle(store, settings)
    assert (result.checked, result.errors) == (16, 0)
    with store.engine.connect() as conn:
        nodes = set(
            conn.scalars(
                select(Execution.node_id)
                .join(Run, Run.id == Execution.run_id)
                .join(FamilyRow, FamilyRow.id == Run.family_id)
                .where(FamilyRow.name == "check_page")
            )
        )
    seen = [r for r in site.requests() if r.target.startswith("/p")]
    edges = sorted([(r.started, 1) for r in seen] + [(r.finished, -1) for r in seen])
    in_flight = peak = 0
    for _at, step in edges:
        in_flight += step
        peak = max(peak, in_flight)
    if strategy == "affinity":
        assert len(nodes) == 1 and peak <= 2
    else:
        assert len(nodes) == 2


def test_not_modified_reads_no_body_and_sends_validators_as_given(
    store, agents, settings, site, inbox
):
    etag = 'W/"v-1; odd=yes"'
    stamp = "Tue, 15 Nov 1994 12:45:26 GMT"
    site.set_page("/e", html("E", "etag page"), headers={"ETag": etag})
    site.set_page("/m", html("M", "dated page"), headers={"Last-Modified": stamp})
    add_users_tracking(store, site.url("/e"), ["ann@example.org"])
    add_users_tracking(store, site.url("/m"), ["ann@example.org"])
    agents(1, env=agent_env(inbox))
    run_app_cycle(store, settings)
    again = run_app_cycle(store, settings)
    assert (again.checked, again.not_modified, again.changed) == (2, 2, 0)
    e_second = site.requests("/e")[-1]
    assert e_second.headers["if-none-match"] == etag
    assert (e_second.status, e_second.body_sent, e_second.bytes_sent) == (304, False, 0)
    m_second = site.requests("/m")[-1]
    assert m_second.headers["if-modified-since"] == stamp
    assert (m_second.status, m_second.body_sent) == (304, False)
    assert page_row(store, site.url("/m")).last_modified == stamp
    with sessionmaker(store.engine)() as s:
        run_id = s.scalar(select(AppCycle.check_run_id).where(AppCycle.id == again.id))
        results = [
            json.loads(r)
            for r in s.scalars(
                select(Execution.result).where(
                    Execution.run_id == run_id, Execution.state == ExecState.DONE
                )
            )
        ]
    assert all(r["not_modified"] and r["size"] == 0 and "views" not in r for r in results)


def test_ssrf_targets_are_refused_with_a_recorded_error(store, agents, settings, site, inbox):
    site.set_page("/ok", html("Fine", "public content"))
    site.set_redirect("/jump", "http://169.254.169.254/latest/meta-data/")
    targets = {
        "http://169.254.169.254/latest/meta-data/": "169.254.169.254",
        "http://10.0.0.1/admin": "10.0.0.1",
        "http://100.64.0.1/": "100.64.0.1",
        "http://[::ffff:192.168.0.1]/": "IPv4-mapped private",
        site.url("/jump"): "169.254.169.254",
    }
    for url in [*targets, site.url("/ok")]:
        add_users_tracking(store, url, ["eve@example.org"])
    agents(1, env=agent_env(inbox))  # allowlist: 127.0.0.0/8 only
    result = run_app_cycle(store, settings)
    assert (result.checked, result.errors) == (6, 5)
    for url, address in targets.items():
        page = page_row(store, url)
        assert page.last_error is not None and page.last_error.startswith("refused: "), url
        assert address in page.last_error
        assert page.fingerprint is None
    assert page_row(store, site.url("/ok")).last_error is None
    assert len(site.requests("/jump")) == 1  # the hop was fetched, its target never


def test_without_the_allowlist_loopback_is_refused(store, agents, settings, site, inbox):
    site.set_page("/ok", html("Fine", "content"))
    add_users_tracking(store, site.url("/ok"), ["eve@example.org"])
    agents(1, env=agent_env(inbox, allow=None))
    result = run_app_cycle(store, settings)
    assert result.errors == 1
    error = page_row(store, site.url("/ok")).last_error
    assert error.startswith("refused: ") and "127.0.0.1" in error
    assert site.requests() == []
    with sessionmaker(store.engine)() as s:
        assert s.scalar(select(func.count()).select_from(Snapshot)) == 0


# The kill test: a cycle is SIGKILLed at every step in turn (the application's steps,
# the JODL runs' own crash points inside both job steps), restarted each time, and
# must finish with every digest sent exactly once.
KILL_CHAIN = (
    "app_prepare",
    "app_check_page_opened",
    "after_send",  # check jobs sent to the agent, nothing collected
    "before_commit",  # check results collected, not committed
    "app_check",
    "app_analyse",
    "app_prepare_notifications",
    "app_notify_opened",
    "after_send",  # digests handed to the agent, nothing collected
    "before_commit",  # the agent sent them; the master dies before committing that
    "app_send_ran",
    "app_send",
    "app_finish",
)


def test_a_kill_and_restart_at_each_step_sends_no_duplicate_mail(
    store, agents, settings, site, inbox, db_url
):
    for name in ("p", "q"):
        site.set_page(f"/{name}", html(name, "v1"), headers={"ETag": '"1"'})
    add_users_tracking(store, site.url("/p"), ["ann@example.org", "all@example.org"])
    add_users_tracking(store, site.url("/q"), ["bob@example.org", "all@example.org"])
    agents(1, env=agent_env(inbox))
    run_app_cycle(store, settings)
    for name in ("p", "q"):
        site.set_page(f"/{name}", html(name, "v2"), headers={"ETag": '"2"'})
    env = {"JODL_DATABASE_URL": db_url, "JODL_MAIL_FROM": "JODL <jodl@example.org>"}
    for point in KILL_CHAIN:
        killed = run_jodl("cycle", env={**env, "JODL_FAILPOINT": point})
        assert killed.returncode == -9, (point, killed.stdout, killed.stderr)
        with sessionmaker(store.engine)() as s:
            assert s.scalar(select(func.count()).where(AppCycle.is_open.is_(True))) == 1
    final = run_jodl("cycle", env=env)
    assert final.returncode == 0, final.stderr
    assert "(resumed)" in final.stdout

    assert inbox.per_recipient() == {
        "ann@example.org": 1,
        "bob@example.org": 1,
        "all@example.org": 1,
    }
    assert len(inbox.to("all@example.org")[0].text.split("* ")) == 3  # both pages, one digest
    with sessionmaker(store.engine)() as s:
        cycle = s.scalar(select(AppCycle).order_by(AppCycle.id.desc()).limit(1))
        assert (cycle.step, cycle.is_open, cycle.changed, cycle.sent) == (
            CycleStep.DONE,
            None,
            2,
            3,
        )
        # Not sent twice in the first place: one attempt per digest, none a duplicate.
        results = s.execute(
            select(Execution.job_id, Execution.result).where(
                Execution.run_id == cycle.notify_run_id, Execution.state == ExecState.DONE
            )
        ).all()
        assert len(results) == 3
        assert all(json.loads(r)["sent"] is True for _, r in results)
        runs = s.scalar(select(func.count()).select_from(Run).where(Run.id == cycle.check_run_id))
        assert runs == 1
    # A later cycle sends nothing again.
    again = run_app_cycle(store, settings)
    assert again.sent == 0
    assert sum(inbox.per_recipient().values()) == 3


def test_snapshots_are_kept_up_to_the_retention_limit(store, agents, settings, site, inbox):
    site.set_page("/r", html("R", "version 0"))
    add_users_tracking(store, site.url("/r"), ["ann@example.org"])
    agents(1, env=agent_env(inbox))
    app = app_settings(snapshot_retention=2)
    run_app_cycle(store, settings, app)
    for version in (1, 2, 3):
        site.set_page("/r", html("R", f"version {version}"))
        assert run_app_cycle(store, settings, app).changed == 1  # confirmed at once
    with sessionmaker(store.engine)() as s:
        kept = s.scalars(select(Snapshot).order_by(Snapshot.id)).all()
        assert [snap.text for snap in kept] == ["version 2", "version 3"]
    assert len(inbox.to("ann@example.org")) == 3
    # The newest digest's diff is against the previous snapshot.
    assert "- version 2" in inbox.to("ann@example.org")[-1].text


def test_jodl_check_prints_what_a_check_sees(site):
    site.set_page("/c", html("Checked", "hello there"))
    allowed = run_jodl("check", site.url("/c"), "--text", env={"JODL_FETCH_ALLOW": "127.0.0.0/8"})
    assert allowed.returncode == 0, allowed.stderr
    assert f"{site.url('/c')}: HTTP 200" in allowed.stdout
    assert "'Checked'" in allowed.stdout
    assert "hello there" in allowed.stdout
    refused = run_jodl("check", site.url("/c"))
    assert refused.returncode == 1
    assert "refused:" in refused.stdout and "127.0.0.1" in refused.stdout
    bad = run_jodl("check", "file:///etc/passwd")
    assert bad.returncode == 1
    assert bad.stderr.strip() == (
        "error: 'file:///etc/passwd' is refused: scheme 'file' is not allowed; use http or https"
    )


def digest_payload(key: str, to: str = "ann@example.org") -> dict[str, str]:
    digest = mail.Digest(
        to,
        [
            mail.ChangedPage(
                url="http://example.org/<b>",
                title="<script>alert(1)</script>",
                selector=None,
                changed_at=dt.datetime(2030, 1, 2, 3, 4),
                diff="- old <i>\n+ new & improved",
                page_id=7,
            )
        ],
        app_url="http://ui.example.org/",
    )
    subject, text, body = mail.render(digest)
    return {
        "key": key,
        "message_id": f"<{key}.1@example.org>",
        "from": "JODL <jodl@example.org>",
        "to": to,
        "subject": subject,
        "text": text,
        "html": body,
    }


def test_notify_sends_a_digest_once_per_key_even_across_restarts(store, db_url, inbox, monkeypatch):
    monkeypatch.setenv("JODL_SMTP_HOST", "127.0.0.1")
    monkeypatch.setenv("JODL_SMTP_PORT", str(inbox.port))
    monkeypatch.setenv("JODL_DATABASE_URL", db_url)  # the claims are in the shared database
    first = Notify()
    assert first.run(digest_payload("digest-1-1"))["sent"] is True
    assert first.run(digest_payload("digest-1-1")) == {
        "sent": False,
        "duplicate": True,
        "message_id": "<digest-1-1.1@example.org>",
    }
    restarted = Notify()  # a new agent process (or another agent) on the same database
    assert restarted.run(digest_payload("digest-1-1"))["duplicate"] is True
    assert restarted.run(digest_payload("digest-2-1"))["sent"] is True
    assert inbox.per_recipient() == {"ann@example.org": 2}
    got = inbox.to("ann@example.org")[0]
    assert got.message_id == "<digest-1-1.1@example.org>"
    # Autoescaped HTML; the text part is plain text.
    assert "<script>" not in got.html and "&lt;script&gt;alert(1)&lt;/script&gt;" in got.html
    assert "new &amp; improved" in got.html
    assert "<script>alert(1)</script>" in got.text
    assert "history: http://ui.example.org/pages/7" in got.text


def test_notify_retries_when_the_smtp_server_is_down(store, db_url, inbox, monkeypatch):
    monkeypatch.setenv("JODL_DATABASE_URL", db_url)
    monkeypatch.setenv("JODL_SMTP_HOST", "127.0.0.1")
    monkeypatch.setenv("JODL_SMTP_PORT", str(free_port()))  # nothing listens there
    down = Notify()
    with pytest.raises(RuntimeError, match="SMTP error"):
        down.run(digest_payload("digest-3-1"))
    # Nothing went out, so the key is free again: a retry (here to a live server) sends it.
    down.settings = dataclasses.replace(down.settings, smtp_port=inbox.port)
    assert down.run(digest_payload("digest-3-1"))["sent"] is True
    assert inbox.per_recipient() == {"ann@example.org": 1}


def test_the_operators_page_follows_a_requested_cycle_to_its_end(
    store, agents, settings, site, db_url
):
    """Issue 24: "Start a cycle now" shows waiting, then running, then done; never
    "waiting for a master" once a master took it."""
    site.set_page("/r", html("Requested", "some text"))
    add_users_tracking(store, site.url("/r"), ["ann@example.org"])
    agents(1, env=agent_env())
    app = create_app(
        WebSettings(database_url=db_url, web_secure_cookies=False), engine=store.engine
    )
    app.testing = True
    make_user(app, "ops@example.org", admin=True)
    client = app.test_client()
    login(client, "ops@example.org")

    def listed() -> str:
        page = client.get("/admin/").get_data(as_text=True)
        found = lxml.html.fromstring(page).xpath("//ul[@id='cycle-requests']")
        return found[0].text_content() if found else ""

    assert (
        client.post("/admin/cycle", data={"csrf_token": token(client, "/admin/")}).status_code
        == 303
    )
    assert "waiting for a master" in listed()
    master = Master(settings, store=store, name="m1")
    seen_running: list[str] = []

    def run_family(*args, **kwargs):
        seen_running.append(listed())  # the page while the cycle's check runs
        return master.run_cycle(*args, **kwargs)

    try:
        scheduler = CycleScheduler(store.engine, run_family, app_settings(), name="m1")
        result = scheduler.serve_requests()  # as the running master's scheduler does
    finally:
        master.close()
    assert result is not None and result.checked == 1
    assert seen_running and all("running on m1" in text for text in seen_running)
    after = listed()
    assert "waiting" not in after and f"done (cycle {result.id})" in after
