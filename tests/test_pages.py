"""Users, pages and trackings: one page and one check_page job per URL, however many trackers."""

from __future__ import annotations

import json

import pytest
from agents import run_jodl  # noqa: I001 - tests/ is on sys.path
from sqlalchemy import func, select
from sqlalchemy.orm import sessionmaker

from crawler_app.models import Page, PageView, Tracking, User
from crawler_app.users import pages
from jodl.log.models import FamilyRow, Job, JobState


@pytest.fixture
def sessions(store):
    return sessionmaker(store.engine, expire_on_commit=False)


def check_jobs(session):
    return session.execute(
        select(Job.key, Job.state)
        .join(FamilyRow, FamilyRow.id == Job.family_id)
        .where(FamilyRow.name == pages.CHECK_FAMILY)
    ).all()


@pytest.mark.parametrize(
    ("given", "normal"),
    [
        ("HTTP://Example.ORG:80/a?b=1#frag", "http://example.org/a?b=1"),
        ("https://example.org:443", "https://example.org/"),
        ("http://example.org:8080/x", "http://example.org:8080/x"),
        ("  http://bücher.example/  ", "http://xn--bcher-kva.example/"),
    ],
)
def test_urls_are_normalised(given, normal):
    assert pages.normalise_url(given) == normal


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("file:///etc/passwd", "scheme 'file'"),
        ("http://user:pw@example.org/", "credentials"),
        ("http://example.org\\@evil/", "backslash"),
        ("http://0177.0.0.1/", "0177.0.0.1"),
        ("gopher://example.org/", "scheme"),
    ],
)
def test_bad_urls_are_refused_at_track_time(url, why):
    with pytest.raises(pages.PageError, match="is refused") as info:
        pages.normalise_url(url)
    assert why in str(info.value)


def test_users_have_hashed_passwords_and_unique_addresses(sessions):
    with sessions() as s, s.begin():
        user = pages.add_user(s, " Ann@Example.org ", "s3cret")
        assert user.email == "ann@example.org"
        assert user.password_hash and "s3cret" not in user.password_hash
        assert pages.check_password(user, "s3cret")
        assert not pages.check_password(user, "wrong")
        with pytest.raises(pages.PageError, match="already exists"):
            pages.add_user(s, "ann@EXAMPLE.org")
        with pytest.raises(pages.PageError, match="not an e-mail"):
            pages.add_user(s, "no-at-sign")
        mailonly = pages.add_user(s, "bo@example.org")
        assert not pages.check_password(mailonly, "")


def test_a_url_tracked_by_a_thousand_users_is_one_page_and_one_job(sessions):
    forms = ["http://Example.org/news", "http://example.org:80/news#top", "HTTP://EXAMPLE.ORG/news"]
    with sessions() as s, s.begin():
        for i in range(1000):
            pages.add_user(s, f"u{i}@example.org")
        for i in range(1000):
            pages.track(s, f"u{i}@example.org", forms[i % 3])
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Page)) == 1
        assert s.scalar(select(func.count()).select_from(Tracking)) == 1000
        assert check_jobs(s) == [("http://example.org/news", JobState.IDLE)]
        page = s.scalar(select(Page))
        job = s.get(Job, page.job_id)
        assert job.key == page.url
        assert json.loads(job.payload)["url"] == page.url


def test_untracked_pages_keep_history_but_their_job_is_deleted_and_revived(sessions):
    with sessions() as s, s.begin():
        pages.add_user(s, "a@example.org")
        pages.add_user(s, "b@example.org")
        pages.track(s, "a@example.org", "http://example.org/p")
        pages.track(s, "b@example.org", "http://example.org/p")
        job_id = s.scalar(select(Page.job_id))
    with sessions() as s, s.begin():
        assert pages.untrack(s, "a@example.org", "http://example.org/p")
        assert not pages.untrack(s, "a@example.org", "http://example.org/p")
        assert check_jobs(s) == [("http://example.org/p", JobState.IDLE)]
        assert pages.untrack(s, "b@example.org", "http://EXAMPLE.org/p")
        assert check_jobs(s) == [("http://example.org/p", JobState.DELETED)]
        assert s.scalar(select(func.count()).select_from(Page)) == 1
    with sessions() as s, s.begin():
        pages.track(s, "b@example.org", "http://example.org/p", period=3)
        assert s.scalar(select(Page.job_id)) == job_id
        job = s.get(Job, job_id)
        assert (job.state, job.every_n_cycles) == (JobState.IDLE, 3)


def test_each_selector_is_a_view_of_the_page(sessions):
    with sessions() as s, s.begin():
        for name in ("a", "b", "c"):
            pages.add_user(s, f"{name}@example.org")
        pages.track(s, "a@example.org", "http://example.org/", selector="#main")
        pages.track(s, "b@example.org", "http://example.org/", selector="  #main ")
        pages.track(s, "c@example.org", "http://example.org/")
        with pytest.raises(pages.PageError, match="invalid CSS selector"):
            pages.track(s, "c@example.org", "http://example.org/", selector="div[")
    with sessions() as s:
        views = sorted(s.scalars(select(PageView.selector)))
        assert views == ["", "#main"]
        assert len(check_jobs(s)) == 1


def test_removing_a_user_stops_checks_of_pages_only_they_tracked(sessions):
    with sessions() as s, s.begin():
        pages.add_user(s, "a@example.org")
        pages.add_user(s, "b@example.org")
        pages.track(s, "a@example.org", "http://example.org/only-a")
        pages.track(s, "a@example.org", "http://example.org/both")
        pages.track(s, "b@example.org", "http://example.org/both")
    with sessions() as s, s.begin():
        pages.remove_user(s, "a@example.org")
    with sessions() as s:
        assert dict(check_jobs(s)) == {
            "http://example.org/only-a": JobState.DELETED,
            "http://example.org/both": JobState.IDLE,
        }
        assert s.scalar(select(func.count()).select_from(User)) == 1


def test_cli_users_track_untrack(store, db_url):
    env = {"JODL_DATABASE_URL": db_url}
    ok = run_jodl("users", "add", "Carol@Example.org", env=env)
    assert ok.returncode == 0, ok.stderr
    assert "carol@example.org added" in ok.stdout
    again = run_jodl("users", "add", "carol@example.org", env=env)
    assert again.returncode == 1
    assert again.stderr.strip() == "error: user carol@example.org already exists"
    tracked = run_jodl(
        "track", "http://Example.org/x", "--user", "carol@example.org", "--selector", "h1", env=env
    )
    assert tracked.returncode == 0, tracked.stderr
    assert "tracks http://example.org/x (selector h1)" in tracked.stdout
    refused = run_jodl("track", "file:///etc/passwd", "--user", "carol@example.org", env=env)
    assert refused.returncode == 1
    assert "scheme 'file' is not allowed" in refused.stderr
    assert "Traceback" not in refused.stderr
    listing = run_jodl("tracked", env=env)
    assert "http://example.org/x [h1]  carol@example.org  checked=never" in listing.stdout
    gone = run_jodl("untrack", "http://example.org/x", "--user", "carol@example.org", env=env)
    assert gone.returncode == 0, gone.stderr
    missing = run_jodl("untrack", "http://example.org/x", "--user", "carol@example.org", env=env)
    assert missing.returncode == 1
    assert "does not track" in missing.stderr


def test_cli_says_to_upgrade_an_empty_database(tmp_path):
    (tmp_path / "empty.db").touch()  # there, but without tables (a missing file: test_first_hour)
    result = run_jodl(
        "users",
        "add",
        "d@example.org",
        env={"JODL_DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}"},
    )
    assert result.returncode == 1
    assert result.stderr.strip() == (
        "error: the database has no page checker tables; run: jodl db upgrade"
    )
