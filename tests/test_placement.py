"""Placement strategies as pure functions over a constructed view (no agents, no database)."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from jodl.placement import (
    DEFAULT_DURATION,
    JobInfo,
    Knowledge,
    Learned,
    NodeLoad,
    Placement,
    account_homes,
    known,
    per_cycle,
    strategy,
)
from jodl.placement.strategies import EarliestFinish, affinity_key, rendezvous_score

DOCS = Path(__file__).resolve().parent.parent / "docs" / "placement.md"


def nodes(*speeds: float, slots: int = 1) -> list[NodeLoad]:
    return [NodeLoad(i + 1, f"127.0.0.1:{9000 + i}", slots, s) for i, s in enumerate(speeds)]


def job(i: int, key: str | None = None, **kw: object) -> JobInfo:
    return JobInfo(i, key or f"job-{i}", "fam", **kw)  # type: ignore[arg-type]


def knowledge_for(works: dict[int, float], node_speeds: dict[int, float]) -> Knowledge:
    """Knowledge where job j ran once on node (j % n) + 1 and took work/speed there."""
    k = Knowledge()
    ids = sorted(node_speeds)
    for j, w in works.items():
        n = ids[j % len(ids)]
        k.record(j, n, "fam", w / node_speeds[n])
    k.set_speeds(node_speeds)
    return k


def makespan(pairs: list[tuple[JobInfo, NodeLoad]], works: dict[int, float]) -> float:
    finish: dict[int, float] = {}
    for info, node in pairs:
        finish[node.id] = finish.get(node.id, 0.0) + works[info.id] / node.speed
    return max(finish.values())


# -- learning ---------------------------------------------------------------------------


def test_learned_mean_spread_and_moving_average() -> None:
    stat = Learned()
    for d in (1.0, 2.0, 3.0):
        stat.add(d)
    assert stat.count == 3 and stat.mean == pytest.approx(2.0)
    assert stat.spread == pytest.approx(1.0)
    assert stat.last == 3.0
    assert stat.recent == pytest.approx(0.3 * 3 + 0.7 * (0.3 * 2 + 0.7 * 1))  # weight 0.3


def test_expected_follows_the_fallback_chain_in_order() -> None:
    k = Knowledge(default_duration=2.0)
    fast, slow = NodeLoad(1, "a", speed=2.0), NodeLoad(2, "b", speed=0.5)
    k.set_speeds({1: 2.0, 2: 0.5})
    unknown = job(9)
    # 5. nothing known: the configured default, scaled by the node's speed
    assert k.expected(unknown, fast) == pytest.approx(1.0)
    # 4. the family's mean everywhere, scaled by speed
    k.record(50, 1, "fam", 3.0)
    other = NodeLoad(3, "c", speed=1.5)
    assert k.expected(unknown, other) == pytest.approx(3.0 / 1.5)
    # 3. the family's mean on that node
    assert k.expected(unknown, fast) == pytest.approx(3.0)
    # 2. the job's mean on other nodes, scaled by their speed over this node's
    k.record(9, 1, "fam", 1.0)  # 1 s on a 2x node = 2 units of work
    assert k.expected(unknown, slow) == pytest.approx(2.0 / 0.5)
    # 1. learned on the node itself wins
    k.record(9, 2, "fam", 7.0)
    assert k.expected(unknown, slow) == pytest.approx(7.0)


def test_speeds_are_learned_from_jobs_seen_on_several_nodes() -> None:
    true = {1: 1.0, 2: 1.0, 3: 2.0, 4: 4.0}
    rng = random.Random(3)
    k = Knowledge()
    for j in range(60):
        work = rng.lognormvariate(0, 1)
        for n in rng.sample(sorted(true), 2):
            k.record(j, n, "fam", work / true[n])
    speeds = k.learn_speeds()
    assert speeds[4] / speeds[1] == pytest.approx(4.0, rel=1e-6)
    assert speeds[3] / speeds[2] == pytest.approx(2.0, rel=1e-6)
    assert sum(speeds.values()) / 4 == pytest.approx(1.0)


def test_speeds_fall_back_to_family_means_when_no_job_is_shared() -> None:
    k = Knowledge()
    for j in range(40):  # the same mix of jobs on both nodes, no job on both
        k.record(j, 1 + j % 2, "fam", (1.0 + (j // 2) % 5) / (1.0 if j % 2 == 0 else 3.0))
    speeds = k.learn_speeds()
    assert speeds[2] / speeds[1] == pytest.approx(3.0, rel=1e-6)


# -- earliest expected finish --------------------------------------------------------------


def test_known_long_jobs_are_placed_first() -> None:
    k = knowledge_for({1: 1.0, 2: 9.0, 3: 4.0}, {1: 1.0})
    order = EarliestFinish().order([job(1), job(2), job(3), job(4)], k)
    # job 4 is unknown: it counts as the family's mean (4.67) and so goes second
    assert [j.id for j in order] == [2, 4, 3, 1]
    prio = EarliestFinish().order([job(2), job(1, priority=5)], k)
    assert prio[0].id == 1  # priority first, then length


def test_short_jobs_are_spread_over_a_nodes_queue_not_all_last() -> None:
    """Longest first, except jobs shorter than ``spread_below``: those go evenly over
    the time of the longer ones, so a cycle's end does not flood the master with them."""
    works = {j: 1.0 - 0.1 * j for j in range(4)} | {j: 0.001 for j in range(4, 12)}
    k = knowledge_for(works, {1: 1.0})
    (node,) = nodes(1.0)
    pairs = EarliestFinish().place([job(j) for j in works], lambda _j: [node], k)
    assert [j.id for j, _n in pairs] == [0, 4, 5, 1, 6, 7, 2, 8, 9, 3, 10, 11]
    (node,) = nodes(1.0)
    lpt = EarliestFinish(spread_below=0).place([job(j) for j in works], lambda _j: [node], k)
    assert [j.id for j, _n in lpt] == list(range(12))


def test_a_batch_of_jobs_all_too_short_to_sort_is_placed_by_id() -> None:
    """A batch whose jobs are all shorter than ``spread_below`` (no-op jobs) is not
    sorted by their durations: by priority, then id, the order they lie in memory.
    One longer job among them, or ``spread_below=0``: all longest first, as ever."""
    works = {1: 0.004, 2: 0.002, 4: 0.009, 6: 0.001}
    k = knowledge_for(works | {3: 2.0}, {1: 1.0})
    short = [job(j) for j in (6, 2, 1, 4)]
    assert [j.id for j in EarliestFinish().order(short, k)] == [1, 2, 4, 6]
    urgent = EarliestFinish().order([*short, job(5, priority=2)], knowledge_for(works, {1: 1.0}))
    assert [j.id for j in urgent] == [5, 1, 2, 4, 6]
    assert [j.id for j in EarliestFinish(spread_below=0).order(short, k)] == [4, 1, 2, 6]
    mixed = EarliestFinish().order([*short, job(3)], k)
    assert [j.id for j in mixed] == [3, 4, 1, 2, 6]


def test_a_few_long_jobs_in_a_batch_of_short_ones_go_first_and_the_rest_by_id() -> None:
    """At most one job in FEW_LONG at or over ``spread_below`` (a no-op job that once
    waited for the interpreter): those first, longest first, then the short ones by
    id; one more and the batch is all longest first."""
    from jodl.placement.strategies import FEW_LONG

    short = {i: 0.001 + (i * 7 % 13) / 1000 for i in range(1, 2 * FEW_LONG + 1)}
    few = short | {1000: 0.02, 1001: 0.5}
    k = knowledge_for(few, {1: 1.0})
    batch = [job(j) for j in reversed(few)]
    assert [j.id for j in EarliestFinish().order(batch, k)] == [1001, 1000, *sorted(short)]
    many = few | {1002: 0.03}
    k = knowledge_for(many, {1: 1.0})
    batch = [job(j) for j in many]
    ordered = [j.id for j in EarliestFinish().order(batch, k)]
    assert ordered == sorted(many, key=lambda j: (-many[j], j)), "longest first"


def test_placements_go_through_a_subclass_own_place() -> None:
    """The master places through ``placements()``: a strategy that overrides ``place()``
    is still the one that decides, each job given what it is expected to take there."""

    class FirstNodeOnly(EarliestFinish):
        def place(self, jobs, candidates, knowledge):  # type: ignore[no-untyped-def]
            out = []
            for j in jobs:
                node = candidates(j)[0]
                node.queued_work += knowledge.expected(j, node)
                out.append((j, node))
            return out

    k = knowledge_for({1: 1.0, 2: 3.0}, {1: 1.0, 2: 2.0})
    ns = nodes(1.0, 2.0)
    placed = FirstNodeOnly().placements([job(1), job(2), job(3)], lambda _j: ns, k)
    assert [(j.id, n.id) for j, n, _t in placed] == [(1, 1), (2, 1), (3, 1)]
    assert [t for _j, _n, t in placed] == [k.expected(job(i), ns[0]) for i in (1, 2, 3)]
    assert ns[0].queued_work == pytest.approx(sum(t for _j, _n, t in placed))


def test_placements_through_a_subclass_place_that_calls_the_parent() -> None:
    """A subclass's ``place`` that filters the batch and hands the rest to
    ``super().place`` is placed through once, with no call going round in a circle."""

    class WithoutOdd(EarliestFinish):
        def place(self, jobs, candidates, knowledge):  # type: ignore[no-untyped-def]
            return super().place([j for j in jobs if j.id % 2 == 0], candidates, knowledge)

    k = knowledge_for({1: 1.0, 2: 3.0, 4: 2.0}, {1: 1.0, 2: 1.0})
    ns = nodes(1.0, 1.0)
    placed = WithoutOdd().placements([job(i) for i in (1, 2, 3, 4)], lambda _j: ns, k)
    assert sorted(j.id for j, _n, _t in placed) == [2, 4]
    assert [t for j, n, t in placed] == [k.expected(j, n) for j, n, _t in placed]


def test_earliest_finish_weighs_queue_against_speed() -> None:
    k = knowledge_for({1: 4.0}, {1: 1.0, 2: 4.0})
    slow, fast = nodes(1.0, 4.0)
    ef = EarliestFinish()
    assert ef.choose(job(1), [slow, fast], k) is fast
    fast.queued_work = 10.0  # the fast node is busy for 10 s: the slow one ends first
    assert ef.choose(job(1), [slow, fast], k) is slow


def test_earliest_finish_not_most_jobs() -> None:
    """Many short jobs queued end sooner than one long job: load is time, not count."""
    k = Knowledge()
    a, b = nodes(1.0, 1.0)
    a.queued_jobs, a.queued_work = 10, 1.0
    b.queued_jobs, b.queued_work = 1, 5.0
    assert EarliestFinish().choose(job(1), [a, b], k) is a


def test_lpt_plan_is_close_to_the_lower_bound() -> None:
    rng = random.Random(7)
    speeds = {1: 1.0, 2: 1.0, 3: 2.0, 4: 4.0}
    works = {j: rng.lognormvariate(0, 1) for j in range(400)}
    k = knowledge_for(works, speeds)
    ns = [NodeLoad(n, f"n{n}", 1, s) for n, s in speeds.items()]
    pairs = EarliestFinish().place([job(j) for j in works], lambda _j: ns, k)
    assert len(pairs) == 400
    lb = max(sum(works.values()) / sum(speeds.values()), max(works.values()) / 4.0)
    assert makespan(pairs, works) <= 1.02 * lb
    # round robin on the same view is far off: the slow nodes get as many jobs
    rr_nodes = [NodeLoad(n, f"n{n}", 1, s) for n, s in speeds.items()]
    rr = strategy("round_robin").place([job(j) for j in works], lambda _j: rr_nodes, k)
    assert makespan(rr, works) > 1.5 * lb


class Scanning(EarliestFinish):
    """earliest_finish judging every job by the scan over all nodes (no heap)."""

    def _front(self, *_args: object) -> None:
        return None


@pytest.mark.parametrize("seed", range(5))
def test_heap_places_new_jobs_as_the_scan_does(seed: int) -> None:
    """Jobs nothing is known of take the heap (O(log n) each), the others the scan;
    mixed in one batch, with ties, homes, reservations and two families, both place
    every job on the same node as scanning all of them does."""
    rng = random.Random(seed)

    def view() -> list[NodeLoad]:
        rnd = random.Random(seed)
        out = []
        for n in range(1, 41):
            node = NodeLoad(n, f"n{n}", rnd.choice((1, 2, 4)), rnd.choice((1.0, 1.0, 2.0)))
            node.queued_work = float(rnd.choice((0, 0, 1, 3)))
            node.home_work = float(rnd.choice((0, 0, 2)))
            out.append(node)
        return out

    k = Knowledge()
    for j in range(0, 300, 3):  # a third of the jobs ran before, some families' too
        k.record(j, 1 + j % 40, "fam" if j % 2 else "other", rng.choice((0.5, 1.0, 2.0)))
    jobs = [
        JobInfo(
            j,
            f"job-{j}",
            "fam" if j % 2 else "other",
            permanent_node_id=rng.choice((None, None, 1 + j % 40)) if j % 3 == 0 else None,
            failed_on=frozenset({2}) if j % 50 == 7 else frozenset(),
        )
        for j in range(600)
    ]
    heaped, scanned = view(), view()
    got = EarliestFinish().place(jobs, lambda _j: heaped, k)
    want = Scanning().place(jobs, lambda _j: scanned, k)
    assert [(j.id, n.id) for j, n in got] == [(j.id, n.id) for j, n in want]
    assert len({n.id for _j, n in got}) == 40


class OneByOne(Placement):
    """earliest_finish as its rule reads, one job and one ``expected`` at a time: the
    reference the batch placement (shared lookups, an index of homes) must match."""

    def __init__(self, stickiness: float = 0.5) -> None:
        self.stickiness = stickiness
        self.reserved: dict[int, float] = {}

    def order(self, jobs: list[JobInfo], knowledge: Knowledge) -> list[JobInfo]:
        return sorted(jobs, key=lambda j: (-j.priority, -knowledge.estimate_work(j), j.id))

    def place(self, jobs, candidates, knowledge):  # type: ignore[no-untyped-def]
        self.reserved = {}
        for j in jobs:
            home = next((n for n in candidates(j) if n.id == j.home), None)
            if home is not None and j.home not in j.failed_on:
                self.reserved[home.id] = self.reserved.get(home.id, 0) + knowledge.expected(j, home)
        return super().place(jobs, candidates, knowledge)

    def choose(self, job: JobInfo, candidates, knowledge):  # type: ignore[no-untyped-def]
        home = job.home if job.home not in job.failed_on else None
        if self.reserved and home in self.reserved:
            at = next((n for n in candidates if n.id == home), None)
            if at is not None:
                left = self.reserved[home] - knowledge.expected(job, at)
                self.reserved[home] = max(0.0, left)
        nodes = [n for n in candidates if n.id not in job.failed_on] or list(candidates)
        trial = job.trial_node_id
        tried = knowledge.learned(job.id, trial) if trial is not None else None
        if trial is not None and not (tried and tried.count):
            for n in nodes:
                if n.id == trial:
                    return n

        def key(n: NodeLoad) -> tuple[float, float, int]:  # noqa: E306
            cost = n.expected_finish(knowledge.expected(job, n))
            if self.reserved:
                cost += self.reserved.get(n.id, 0.0) / max(1, n.slots)
            return (cost, n.home_work / max(1e-9, n.speed * n.slots), n.id)

        best = min(nodes, key=key)
        at_home = next((n for n in nodes if n.id == job.home), None)
        if at_home is not None and at_home is not best:
            if key(at_home)[0] <= key(best)[0] + self.stickiness * knowledge.expected(job, best):
                return at_home
        return best


def varied_knowledge(rng: random.Random, jobs: int, nodes: int) -> Knowledge:
    """Jobs run on one node or several, some only failed, a family mean on some nodes only."""
    k = Knowledge()
    for j in range(jobs):
        for _ in range(rng.choice((0, 0, 1, 1, 1, 2, 3))):
            node = rng.randint(1, nodes)
            took = None if rng.random() < 0.1 else rng.choice((0.5, 1.0, 2.0, 4.0))
            k.record(j, node, "fam" if j % 2 else "other", took)
    k.learn_speeds()
    return k


@pytest.mark.parametrize("seed", range(4))
def test_expected_on_all_nodes_is_expected_on_each(seed: int) -> None:
    rng = random.Random(seed)
    k = varied_knowledge(rng, 200, 6)
    view = [NodeLoad(n, f"n{n}", 1, rng.choice((0.5, 1.0, 3.0))) for n in range(1, 8)]
    for j in range(220):  # the last ones never ran
        info = JobInfo(j, f"job-{j}", "fam" if j % 2 else "other")
        assert k.expected_on(info, view) == [k.expected(info, n) for n in view]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("node_count", [2, 7])
def test_batch_placement_places_as_one_job_at_a_time(seed: int, node_count: int) -> None:
    """Homes, trials, failed nodes, reservations, ties and learned durations mixed: the
    batch placement puts every job where the rule applied one job at a time does."""
    rng = random.Random(seed)
    k = varied_knowledge(rng, 400, node_count)

    def view() -> list[NodeLoad]:
        rnd = random.Random(seed)
        out = []
        for n in range(1, node_count + 1):
            node = NodeLoad(n, f"n{n}", rnd.choice((1, 2)), rnd.choice((1.0, 2.0)))
            node.queued_work = float(rnd.choice((0, 1, 3)))
            node.home_work = float(rnd.choice((0, 0, 2)))
            out.append(node)
        return out

    def pick(*choices: object) -> object:
        return rng.choice(choices)

    jobs = [
        JobInfo(
            j,
            f"job-{j}",
            "fam" if j % 2 else "other",
            priority=pick(0, 0, 0, 1),  # type: ignore[arg-type]
            permanent_node_id=pick(None, rng.randint(1, node_count)),  # type: ignore[arg-type]
            trial_node_id=pick(None, None, None, rng.randint(1, node_count)),  # type: ignore[arg-type]
            failed_on=pick(frozenset(), frozenset(), frozenset({1})),  # type: ignore[arg-type]
        )
        for j in range(450)
    ]
    batch, single, again = view(), view(), view()
    got = EarliestFinish().place(jobs, lambda _j: batch, k)
    want = OneByOne().place(jobs, lambda _j: single, k)
    assert [(j.id, n.id) for j, n in got] == [(j.id, n.id) for j, n in want]
    assert [n.queued_work for n in batch] == [n.queued_work for n in single]
    # what the master places through: the same, each with what it was counted at
    placed = EarliestFinish().placements(jobs, lambda _j: again, k)
    assert [(j.id, n.id) for j, n, _took in placed] == [(j.id, n.id) for j, n in want]
    assert [took for _j, _n, took in placed] == [k.expected(j, n) for j, n in want]


def test_home_is_kept_when_cheap_and_left_when_costly() -> None:
    k = knowledge_for({1: 1.0}, {1: 1.0, 2: 1.0})
    a, b = nodes(1.0, 1.0)
    at_home_on_b = job(1, permanent_node_id=2)
    b.queued_work = 0.4  # costs 0.4 x the job's duration: within stickiness 0.5
    assert EarliestFinish().choose(at_home_on_b, [a, b], k) is b
    b.queued_work = 3.0
    assert EarliestFinish().choose(at_home_on_b, [a, b], k) is a
    assert EarliestFinish(stickiness=0).choose(job(1, permanent_node_id=2), [a, b], k) is a


def test_a_trial_not_yet_tried_is_made_and_a_tried_one_is_not_forced() -> None:
    k = knowledge_for({1: 1.0}, {1: 1.0, 2: 1.0})  # job 1 ran on node 2
    a, b, c = nodes(1.0, 1.0, 1.0)
    c.queued_work = 50.0
    trial = job(1, permanent_node_id=2, trial_node_id=3)
    assert EarliestFinish().choose(trial, [a, b, c], k) is c
    k.record(1, 3, "fam", 1.0)  # tried: now it is just the job's current home
    assert EarliestFinish().choose(trial, [a, b, c], k) is not c


def test_nodes_that_failed_the_job_are_avoided() -> None:
    k = Knowledge()
    a, b = nodes(1.0, 1.0)
    b.queued_work = 100.0
    for name in ("earliest_finish", "least_loaded", "round_robin", "affinity"):
        chosen = strategy(name).choose(job(1, failed_on=frozenset({1})), [a, b], k)
        assert chosen is b, name
    # when every node failed it, any node will do
    assert strategy("earliest_finish").choose(job(1, failed_on=frozenset({1, 2})), [a, b], k)


def test_frequency_weights_the_load_of_homes() -> None:
    k = Knowledge()
    a, b = nodes(1.0, 1.0)
    homes = [job(i, permanent_node_id=1) for i in range(4)]  # every cycle on a
    homes += [job(10 + i, permanent_node_id=2, per_cycle=0.25) for i in range(8)]
    account_homes(homes, [a, b], k)
    assert a.home_work == pytest.approx(4 * DEFAULT_DURATION)
    assert b.home_work == pytest.approx(8 * 0.25 * DEFAULT_DURATION)
    # same finish this cycle: the new job's home goes where the load per cycle is lower
    assert EarliestFinish().choose(job(99), [a, b], k) is b


def test_per_cycle_counts_every_n_and_min_interval() -> None:
    assert per_cycle() == 1.0
    assert per_cycle(4) == 0.25
    assert per_cycle(1, min_interval=3600, period=600) == pytest.approx(1 / 6)
    assert per_cycle(10, min_interval=3600, period=600) == pytest.approx(0.1)
    assert per_cycle(1, min_interval=60, period=600) == 1.0


# -- round robin and affinity ----------------------------------------------------------------


def test_round_robin_takes_nodes_in_turn() -> None:
    ns = nodes(1.0, 1.0, 1.0)
    pairs = strategy("round_robin").place([job(i) for i in range(7)], lambda _j: ns, Knowledge())
    assert [n.id for _j, n in pairs] == [1, 2, 3, 1, 2, 3, 1]


def test_affinity_sends_the_same_host_to_the_same_node() -> None:
    ns = nodes(1.0, 1.0, 1.0, 1.0)
    aff = strategy("affinity")
    k = Knowledge()
    pages = [f"https://site{i % 20}.example/p/{i}" for i in range(200)]
    chosen: dict[str, set[int]] = {}
    for i, url in enumerate(pages):
        node = aff.choose(job(i, url), ns, k)
        chosen.setdefault(affinity_key(url), set()).add(node.id)
    assert all(len(v) == 1 for v in chosen.values())
    assert len({next(iter(v)) for v in chosen.values()}) == 4  # and the hosts are spread
    assert affinity_key("HTTPS://WWW.Example.ORG:8080/x") == "www.example.org"
    assert affinity_key("user-42/job-7", pattern=r"user-(\d+)") == "42"


def test_affinity_finds_the_host_of_a_url_after_a_prefix() -> None:
    # The page checker keys a web submission "web:URL" and a baseline check
    # "baseline:URL": they meet the cycle's check of the same host on its node.
    ns = nodes(1.0, 1.0, 1.0, 1.0)
    aff = strategy("affinity")
    for i in range(20):
        url = f"https://site{i}.example/p"
        keys = [url, f"web:{url}?q=1", f"baseline:{url}", f"web:HTTPS://SITE{i}.example:443/x"]
        assert {affinity_key(key) for key in keys} == {f"site{i}.example"}
        assert len({aff.choose(job(i, key), ns, Knowledge()).id for key in keys}) == 1
    assert affinity_key("web:no-url-here/x") == "web:no-url-here"


def test_affinity_lets_hosts_take_turns_within_a_priority() -> None:
    # One host's long run must not fill a node's queue ahead of the other hosts.
    aff = strategy("affinity")
    big = [job(i, f"https://big.example/p/{i}") for i in range(6)]
    small = [job(10 + i, f"https://small{i}.example/") for i in range(2)]
    urgent = job(20, "https://big.example/urgent")._replace(priority=5)
    ordered = aff.order([*big, *small, urgent], Knowledge())
    assert [j.id for j in ordered] == [20, 0, 10, 11, 1, 2, 3, 4, 5]


def _assign(keys: list[str], ns: list[NodeLoad]) -> dict[str, int]:
    return {key: max(ns, key=lambda n: rendezvous_score(key, n)).id for key in keys}


def test_rendezvous_moves_about_one_nth_unlike_modulo() -> None:
    keys = [f"host{i}.example" for i in range(20_000)]
    four, five = nodes(1, 1, 1, 1), nodes(1, 1, 1, 1, 1)
    before, after = _assign(keys, four), _assign(keys, five)
    moved = [key for key in keys if before[key] != after[key]]
    assert 0.17 < len(moved) / len(keys) < 0.23  # about 1/5
    assert all(after[key] == 5 for key in moved)  # and only to the new node
    # removing a node moves only that node's keys
    three = [n for n in four if n.id != 2]
    without = _assign(keys, three)
    assert all(without[k] == before[k] for k in keys if before[k] != 2)
    # modulo hashing moves about 4/5 of the keys for the same change
    modulo_moved = sum(1 for i, _k in enumerate(keys) if i % 4 != i % 5)
    assert modulo_moved / len(keys) > 0.75


def test_rendezvous_weights_follow_slots() -> None:
    small, big = NodeLoad(1, "a", 1), NodeLoad(2, "b", 3)
    keys = [f"k{i}" for i in range(20_000)]
    share = sum(1 for k in keys if rendezvous_score(k, big) > rendezvous_score(k, small))
    assert 0.72 < share / len(keys) < 0.78


# -- registry and extension ------------------------------------------------------------------


def test_registry_errors_are_clear() -> None:
    with pytest.raises(ValueError, match="unknown placement strategy 'nope'.*earliest_finish"):
        strategy("nope")
    with pytest.raises(ValueError, match="bad pattern"):
        strategy("affinity", {"pattern": "(unclosed"})
    with pytest.raises(ValueError, match="unknown 'by' 'planet'"):
        strategy("affinity", {"by": "planet"})
    with pytest.raises(ValueError, match="stickiness"):
        strategy("earliest_finish", {"stickiness": -1})
    assert isinstance(strategy(None), EarliestFinish)
    assert {"earliest_finish", "round_robin", "least_loaded", "affinity"} <= set(known())


def test_new_families_default_to_earliest_finish(tmp_path: Path) -> None:
    from jodl.log import Store, make_engine
    from jodl.log.models import Base

    engine = make_engine(f"sqlite:///{tmp_path / 'd.db'}")
    Base.metadata.create_all(engine)
    fam = Store(engine).ensure_family("sleep")
    assert fam.strategy == "earliest_finish"
    assert isinstance(strategy(fam.strategy, fam.strategy_params), EarliestFinish)


def test_the_documented_rule_based_strategy_works_as_written() -> None:
    text = DOCS.read_text()
    code = re.search(r"```python\n(from urllib.parse.*?)```", text, re.S)
    assert code, "the .org example is missing from docs/placement.md"
    namespace: dict[str, object] = {}
    exec(compile(code.group(1), str(DOCS), "exec"), namespace)  # noqa: S102 - our own docs
    org = strategy("org_on_one_node", {"org_node": "127.0.0.1:9002"})
    assert isinstance(org, Placement)
    ns = nodes(1.0, 1.0, 1.0)
    keys = [f"https://www.site{i}.org/" for i in range(10)]
    keys += [f"https://site{i}.com/" for i in range(10)]
    pairs = org.place([job(i, key) for i, key in enumerate(keys)], lambda _j: ns, Knowledge())
    on = {info.key: node.address for info, node in pairs}
    assert all(on[k] == "127.0.0.1:9002" for k in keys[:10])
    # the rest is placed as usual: around the node the .org jobs keep busy
    assert {on[k] for k in keys[10:]} == {"127.0.0.1:9000", "127.0.0.1:9001"}
