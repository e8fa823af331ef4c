"""FamilyOnNode and family classes enforced by a real master on real agents.

Max slots and deny; a family at another version on an agent; a class not idempotent.

Judged by the ``mark`` family's file (outside JODL): a line when a job starts and
one when it ends, so overlapping jobs and the nodes that ran them show there.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from agents import wait_for
from sqlalchemy import func, select

from jodl.admin.families import FamilyAdmin
from jodl.examples import Mark, Sleep
from jodl.log import Store
from jodl.log.models import Execution
from jodl.master import Master


def add_marks(store: Store, path: Path, count: int, seconds: float) -> None:
    fam = store.ensure_family("mark")
    payload = {"path": str(path), "seconds": seconds, "end": True}
    store.add_jobs(fam, [(f"m{i}", json.dumps({**payload, "key": f"m{i}"})) for i in range(count)])


def most_at_once(path: Path) -> dict[str, int]:
    """Per agent, the most jobs that had started and not ended at one time."""
    running: dict[str, int] = {}
    most: dict[str, int] = {}
    for line in path.read_text().splitlines():
        node, _key, *end = line.split(" ")
        running[node] = running.get(node, 0) + (-1 if end else 1)
        most[node] = max(most.get(node, 0), running[node])
    assert all(n == 0 for n in running.values()), "a job started and never ended"
    return most


def test_max_slots_caps_a_family_on_a_node(store, agents, settings, tmp_path):
    (agent,) = agents(1, slots=4)
    path = tmp_path / "marks"
    add_marks(store, path, 6, 0.3)
    master = Master(settings, store=store)
    try:
        first = master.run_cycle("mark")
        uncapped = most_at_once(path)
        FamilyAdmin(store).set_nodes("mark", [agent.address], True, max_slots=1)
        path.unlink()
        second = master.run_cycle("mark")  # the serving master reads the rule at cycle open
        capped = most_at_once(path)
    finally:
        master.close()
    assert first.done == second.done == 6
    assert max(uncapped.values()) > 1  # without the cap the 4 slots run them together
    assert list(capped.values()) == [1]
    assert len(path.read_text().splitlines()) == 12  # every job ran, one at a time


def test_max_slots_in_a_fresh_master_with_two_families(store, agents, settings, tmp_path):
    (agent,) = agents(1, slots=4)
    path = tmp_path / "marks"
    add_marks(store, path, 5, 0.2)
    FamilyAdmin(store).set_nodes("mark", [agent.address], True, max_slots=2)
    sleep = store.ensure_family("sleep")
    store.add_jobs(sleep, [(f"s{i}", '{"seconds": 0.05}') for i in range(20)])
    master = Master(settings, store=store)
    try:
        marks = master.request_cycle("mark")
        sleeps = master.request_cycle("sleep")
        stop = threading.Event()
        runner = threading.Thread(target=master.serve, args=(stop,), daemon=True)
        runner.start()
        try:
            assert marks.result(timeout=60).done == 5
            assert sleeps.result(timeout=60).done == 20
        finally:
            stop.set()
            runner.join(timeout=30)
    finally:
        master.close()
    assert max(most_at_once(path).values()) <= 2


def test_deny_keeps_a_family_off_a_node(store, agents, settings, tmp_path):
    denied, kept = agents(2, slots=2)
    path = tmp_path / "marks"
    add_marks(store, path, 12, 0.02)
    FamilyAdmin(store).set_nodes("mark", [denied.address], False)
    master = Master(settings, store=store)
    try:
        summary = master.run_cycle("mark")
    finally:
        master.close()
    assert summary.done == 12
    ports = {line.split(" ")[0].rpartition(":")[2] for line in path.read_text().splitlines()}
    assert ports == {kept.address.rpartition(":")[2]}


def test_a_serving_master_reads_rule_changes(store, settings):
    store.ensure_family("mark")
    node = store.add_node("127.0.0.1:7001", slots=4)
    master = Master(settings, store=store)
    try:
        master.families.setup(store.family("mark"))  # as when its first job came
        assert master.families.caps == {}
        admin = FamilyAdmin(store)
        admin.set_nodes("mark", ["127.0.0.1:7001"], True, max_slots=2)
        master.refresh_families(force=True)
        assert master.families.caps == {node.id: {"mark": 2}}
        admin.set_nodes("mark", ["127.0.0.1:7001"], False)
        admin.update("mark", {"max_attempts": 7})
        master.refresh_families(force=True)
        assert master.families.caps == {node.id: {}}
        assert master.families.rules["mark"][node.id].allowed is False
        assert master.families.max_attempts["mark"] == 7
    finally:
        master.close()


class MarkV2(Mark):
    """The mark family at a version the agents do not run."""

    version = "2"


class CountingMaster(Master):
    """A master that counts its loop's steps (to watch it run a while)."""

    steps = 0

    def step(self) -> Any:
        self.steps += 1
        return super().step()


def test_a_family_at_another_version_is_not_sent_to_the_agent(store, agents, settings, caplog):
    (agent,) = agents(1, slots=2)
    add_marks(store, Path("/nonexistent/marks"), 3, 0.0)
    master = CountingMaster(settings, store=store, family_classes={"mark": MarkV2, "sleep": Sleep})
    stop = threading.Event()
    runner = threading.Thread(target=master.serve, args=(stop,), daemon=True)
    try:
        with caplog.at_level(logging.ERROR, logger="jodl.master"):
            master.request_cycle("mark")
            runner.start()
            wait_for(lambda: master.runs and master.steps > 50, what="the loop to run a while")
        (slot,) = master.nodes.values()
        assert slot.link.address == agent.address
        assert slot.usable and slot.wrong_version == {"mark": "1"}
        assert master.fleet.candidates("mark") == []  # unusable for mark, usable for sleep
        assert [n.id for n in master.fleet.candidates("sleep")] == [slot.load.id]
    finally:
        stop.set()
        runner.join(timeout=30)
        master.close()
    lines = [r.getMessage() for r in caplog.records if "version" in r.getMessage()]
    assert lines == [
        f"node {agent.address} has family mark at version 1, this master knows version 2: "
        "no mark jobs go there until both run the same version"
    ]
    with store.engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(Execution)) == 0  # nothing sent


def test_families_without_jobs_here_are_not_checked(store, agents, settings, tmp_path):
    """A family the agents run but this master has no job of is never version-checked,
    so its module is never imported by the master (the balancer asks only of its own)."""
    agents(2, slots=1)
    add_marks(store, tmp_path / "marks", 5, 0.2)
    master = Master(settings, store=store)
    try:
        summary = master.run_cycle("mark")
        slots = list(master.nodes.values())
        assert summary.done == 5 and len(slots) == 2
        for slot in slots:
            assert "mark" not in slot.unchecked  # checked when its first job was placed
            assert "sleep" in slot.unchecked  # served by the agent, never asked about
    finally:
        master.close()


def test_a_family_class_not_idempotent_gets_no_backup_copies(store, agents, settings, tmp_path):
    agents(2, slots=1)
    path = tmp_path / "marks"
    # Idempotent in the log, but the class the agents run (Mark) says a second run
    # leaves a second mark: the class counts, so a straggler gets no backup copy.
    params = {"explore": 0, "backup_factor": 0.5}  # past 0.25 s: a straggler (sleep gets one)
    fam = store.ensure_family("mark", idempotent=True, strategy_params=params)
    payload = {"path": str(path), "seconds": 1.5, "end": True, "key": "slow"}
    store.add_jobs(fam, [("slow", json.dumps(payload))])
    master = Master(settings, store=store)
    try:
        summary = master.run_cycle("mark")  # 1.5 s against an expected 0.5 s: a straggler
    finally:
        master.close()
    assert summary.done == 1
    node = path.read_text().split()[0]
    assert path.read_text().splitlines() == [f"{node} slow", f"{node} slow end"]  # ran once
    with store.engine.connect() as conn:
        assert not conn.scalar(select(func.count()).where(Execution.backup.is_(True)))
