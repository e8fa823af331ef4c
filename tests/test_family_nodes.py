"""FamilyOnNode enforced by a real master on real agents: max slots and deny.

Judged by the ``mark`` family's file (outside JODL): a line when a job starts and
one when it ends, so overlapping jobs and the nodes that ran them show there.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

from jodl.families_admin import FamilyAdmin
from jodl.log import Store
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
        master._family_setup(store.family("mark"))  # as when its first job came
        assert master.caps == {}
        admin = FamilyAdmin(store)
        admin.set_nodes("mark", ["127.0.0.1:7001"], True, max_slots=2)
        master.refresh_families(force=True)
        assert master.caps == {node.id: {"mark": 2}}
        admin.set_nodes("mark", ["127.0.0.1:7001"], False)
        admin.update("mark", {"max_attempts": 7})
        master.refresh_families(force=True)
        assert master.caps == {node.id: {}}
        assert master.rules["mark"][node.id].allowed is False
        assert master.max_attempts["mark"] == 7
    finally:
        master.close()
