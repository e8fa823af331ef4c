"""Web submissions follow host affinity like the cycles' checks: real agents, a serving master.

Six hosts (loopback addresses), two agents: every check of one host, whether a
cycle's (key: the URL), a web submission's (``web:URL``) or a new tracking's
baseline (``baseline:URL``), runs on the one agent that holds that host, so the
per-host limits each agent keeps hold for all of them.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from agents import wait_for
from sqlalchemy import select
from sqlalchemy.orm import sessionmaker
from webserver import AGENT_ENV, ServingMaster

from crawler_app.checking import baselines
from crawler_app.models import Page
from crawler_app.users import pages
from crawler_app.users.pages import CHECK_FAMILY
from jodl.log.models import ExecState, Execution, FamilyRow, Job
from web.batch import Batches
from web.settings import WebSettings

if TYPE_CHECKING:
    from tests.site import TestSite

pytest_plugins = ("tests.site",)


def host_of(key: str) -> str:
    return key.split("://", 1)[1].split(":", 1)[0]


def nodes_by_host(store) -> dict[str, set[int]]:
    """The nodes each host's check_page executions ran on."""
    with sessionmaker(store.engine)() as s:
        rows = s.execute(
            select(Job.key, Execution.node_id)
            .join(Execution, Execution.job_id == Job.id)
            .join(FamilyRow, FamilyRow.id == Job.family_id)
            .where(FamilyRow.name == CHECK_FAMILY, Execution.state == ExecState.DONE)
        ).all()
    out: dict[str, set[int]] = defaultdict(set)
    for key, node_id in rows:
        out[host_of(key)].add(node_id)
    return out


def test_submissions_and_baseline_checks_land_on_their_hosts_agent(
    store, agents, settings, make_site
):
    sites: list[TestSite] = [make_site(f"127.0.0.{i}") for i in range(2, 8)]
    urls = []
    for site in sites:
        for n in range(3):
            site.set_page(f"/p{n}", f"<p>page {n}</p>")
            urls.append(site.url(f"/p{n}"))
    agents(2, env=AGENT_ENV)
    sessions = sessionmaker(store.engine)
    with sessions.begin() as s:
        pages.add_user(s, "ann@example.org")
        for url in urls[::3]:  # one tracked page per host
            pages.track(s, "ann@example.org", url)
    served = ServingMaster(settings, store).start()
    try:
        served.master.request_cycle(CHECK_FAMILY).result(timeout=60)
        with sessions() as s:
            page_ids = list(s.scalars(select(Page.id)))
        assert baselines.request(served.queue, store.engine, page_ids) == len(sites)
        web = Batches(store.engine, WebSettings(database_url="unused"), served.queue)
        submitted = web.submit(urls)
        assert submitted.queued == len(urls)

        def all_done() -> bool:
            return sum(len(v) for v in executions(store).values()) >= 4 + len(sites) + len(urls)

        wait_for(all_done, 60, "every check to finish")
    finally:
        served.stop()
    by_host = nodes_by_host(store)
    assert set(by_host) == {f"127.0.0.{i}" for i in range(2, 8)}
    assert all(len(nodes) == 1 for nodes in by_host.values()), by_host


def executions(store) -> dict[str, list[int]]:
    """Done check_page executions by job key."""
    with sessionmaker(store.engine)() as s:
        rows = s.execute(
            select(Job.key, Execution.id)
            .join(Execution, Execution.job_id == Job.id)
            .join(FamilyRow, FamilyRow.id == Job.family_id)
            .where(FamilyRow.name == CHECK_FAMILY, Execution.state == ExecState.DONE)
        ).all()
    out: dict[str, list[int]] = defaultdict(list)
    for key, exec_id in rows:
        out[key].append(exec_id)
    return out
