"""In-process agents (``local:`` nodes): a master's cycle without rpyc or agent processes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from jodl.agent.client import AgentLink
from jodl.agent.local import (
    InProcessAgent,
    LocalLink,
    _Root,
    make_link,
    running_agent,
    start_agent,
)
from jodl.agent.replies import Remaining
from jodl.exceptions import AgentUnavailable, Fenced
from jodl.log import Store
from jodl.log.models import ExecState, Execution, Job, Node, NodeState
from jodl.master import Master
from jodl.settings.config import Settings

JOBS = 40


@pytest.fixture
def local_agent(settings: Settings) -> Iterator[InProcessAgent]:
    """The in-process agent ``local:1`` (no secret: nothing listens on a network)."""
    agent = start_agent(settings.replace(secret=None, agent_slots=3), "local:1")
    try:
        yield agent
    finally:
        agent.close()


def test_a_run_goes_through_the_in_process_agent(
    store: Store, settings: Settings, local_agent: InProcessAgent, tmp_path: Path
) -> None:
    marks = tmp_path / "marks.txt"
    family = store.ensure_family("mark")
    store.add_jobs(
        family, ((f"m{i}", json.dumps({"key": f"m{i}", "path": str(marks)})) for i in range(JOBS))
    )
    node = store.add_node("local:1", slots=3)
    master = Master(settings.replace(secret=None), store=store)
    try:
        summary = master.run_cycle("mark")
        assert isinstance(master.nodes[node.id].link, LocalLink)
    finally:
        master.close()

    assert (summary.total, summary.done, summary.dead) == (JOBS, JOBS, 0)
    # Every job really ran once, on the in-process agent (the mark is outside JODL).
    lines = marks.read_text().splitlines()
    assert sorted(lines) == sorted(f"local:1 m{i}" for i in range(JOBS))
    with store.session() as s:
        done = s.execute(
            select(Job.key, Execution.result, Execution.node_id)
            .join(Job, Job.id == Execution.job_id)
            .where(Execution.run_id == summary.run_id, Execution.state == ExecState.DONE)
        ).all()
        node_row = s.get(Node, node.id)
        assert node_row is not None
        assert node_row.state == NodeState.ACTIVE
    assert {key: (json.loads(result), node_id) for key, result, node_id in done} == {
        f"m{i}": ({"marked": f"m{i}"}, node.id) for i in range(JOBS)
    }
    # Everything acknowledged: the agent holds no result any more.
    assert local_agent.core.remaining() == (0, 0, 0, 0)


def test_a_local_node_without_its_agent_is_unreachable(store: Store, settings: Settings) -> None:
    assert running_agent("local:7") is None
    link = make_link(1, "local:7", settings)
    assert isinstance(link, LocalLink)
    with pytest.raises(AgentUnavailable, match="no in-process agent local:7"):
        link.open("m", 1)
    assert not link.connected and link.failures == 1
    assert type(make_link(2, "127.0.0.1:9", settings)) is AgentLink


def test_only_wire_values_cross_the_local_link(
    settings: Settings, local_agent: InProcessAgent
) -> None:
    link = make_link(1, "local:1", settings)
    info = link.open("m", 5, json.dumps({"cluster": "c1"}))
    assert info.slots == 3 and "mark" in info.families
    assert info.families["mark"].version == "1"
    assert link.session is not None  # later calls carry the stamp (epoch, session, since)
    remaining = link.remaining(5)
    assert remaining == (0, 0, 0, 0) and isinstance(remaining, Remaining)
    # A list would be a netref over rpyc: the in-process connection refuses it too.
    with pytest.raises(TypeError, match="list may not cross the wire"):
        _Root(local_agent.service).cancel((5, link.session, 0.0), [1, 2])
    # A master of an older epoch is fenced, as over rpyc: the link says so by its type.
    other = make_link(2, "local:1", settings)
    other.open("m2", 6, json.dumps({"cluster": "c1"}))
    with pytest.raises(Fenced, match="newer master"):
        link.remaining(5)
    assert not link.connected
    assert link.last_error is not None and "fenced" in link.last_error
