"""Digests go only to confirmed addresses (issue 14, finding 8), with real agents and SMTP."""

from __future__ import annotations

from typing import TYPE_CHECKING

from app_support import add_users_tracking, agent_env, inbox, run_app_cycle
from sqlalchemy import update
from sqlalchemy.orm import sessionmaker

from crawler_app.models import User

if TYPE_CHECKING:
    from tests.site import TestSite

pytest_plugins = ("tests.site",)
__all__ = ["inbox"]  # the fixture, imported for pytest


def test_no_digest_goes_to_an_unconfirmed_address(store, agents, settings, site: TestSite, inbox):
    site.set_page("/a", "<title>A</title><p>first story</p>")
    url = site.url("/a")
    add_users_tracking(store, url, ["ann@example.org", "eve@example.org"])
    with sessionmaker(store.engine).begin() as s:
        s.execute(update(User).where(User.email == "eve@example.org").values(email_confirmed=False))
    agents(1, env=agent_env(inbox))
    run_app_cycle(store, settings)
    site.set_page("/a", "<title>A</title><p>a new story</p>")
    second = run_app_cycle(store, settings)  # confirmed within the check: digests go out
    assert second.changed == 1 and second.notifications == 1
    assert inbox.per_recipient() == {"ann@example.org": 1}
