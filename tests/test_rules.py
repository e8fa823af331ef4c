"""The master's balancing rules as pure functions (jodl.master.rules): no agents, no database."""

from __future__ import annotations

import random

import pytest

from jodl.log.runs import MIN_LOWER_BOUND, makespan_ratio
from jodl.master import rules
from jodl.master.records import RunSummary
from jodl.master.rules import NodeQueue, Running, Stealable, Tuning
from jodl.placement import JobInfo, Knowledge, NodeLoad


def nodes(*speeds: float, slots: int = 1) -> list[NodeLoad]:
    return [NodeLoad(i + 1, f"127.0.0.1:{9000 + i}", slots, s) for i, s in enumerate(speeds)]


def job(i: int, key: str | None = None, **kw: object) -> JobInfo:
    return JobInfo(i, key or f"job-{i}", "fam", **kw)  # type: ignore[arg-type]


def queue(
    node: NodeLoad,
    finish: float,
    jobs: list[tuple[int, float, bool]],
    idle: bool = False,
    rtt: float = 0.001,
) -> NodeQueue:
    waiting = [Stealable(job(j), d, sent, 1000 + j if sent else None) for j, d, sent in jobs]
    return NodeQueue(node, finish, waiting, rtt, idle, frozenset({"fam"}))


def test_steals_from_the_latest_finish_not_the_most_jobs() -> None:
    k = Knowledge()
    a, b, thief = nodes(1.0, 1.0, 1.0)
    many_short = queue(a, 1.0, [(i, 0.1, False) for i in range(10)])
    few_long = queue(b, 6.0, [(20, 2.0, False), (21, 2.0, False), (22, 2.0, False)])
    k.record(20, 2, "fam", 2.0)
    k.record(21, 2, "fam", 2.0)
    k.record(22, 2, "fam", 2.0)
    steals = rules.plan_steals(
        [many_short, few_long, queue(thief, 0.0, [], True)], k.expected, 0.005
    )
    assert steals and {s.source for s in steals} == {2}
    assert steals[0].job_id == 22  # the one that would start last
    assert all(s.target == 3 for s in steals)


def test_steals_stop_when_the_gain_does_not_beat_the_round_trip() -> None:
    k = Knowledge()
    victim, thief = nodes(1.0, 1.0)
    k.record(1, 1, "fam", 0.02)
    # the job would end 0.02 s later on the victim; the thief needs 0.02 s + a 50 ms round trip
    q = [queue(victim, 0.04, [(1, 0.02, True)], rtt=0.05), queue(thief, 0.0, [], True, rtt=0.05)]
    assert rules.plan_steals(q, k.expected, 0.005) == []
    # 5 ms of gain do not pay for 2 round trips (take back, send) plus the margin
    q = [queue(victim, 0.025, [(1, 0.02, True)]), queue(thief, 0.0, [], True)]
    assert rules.plan_steals(q, k.expected, 0.005) == []
    q = [queue(victim, 2.0, [(1, 0.02, True)]), queue(thief, 0.0, [], True)]
    (steal,) = rules.plan_steals(q, k.expected, 0.005)
    assert steal.exec_id == 1001  # on the agent: it must be asked back


def test_steals_balance_the_pair_and_keep_the_makespan() -> None:
    k = Knowledge()
    slow, fast = NodeLoad(1, "a", 1, 1.0), NodeLoad(2, "b", 1, 4.0)
    k.set_speeds({1: 1.0, 2: 4.0})
    jobs = [(i, 1.0, False) for i in range(12)]
    for i, _d, _s in jobs:
        k.record(i, 1, "fam", 1.0)
    q = [queue(slow, 12.0, jobs), queue(fast, 0.0, [], True)]
    steals = rules.plan_steals(q, k.expected, 0.005)
    # 12 s of work: the fast node (4x) should take about 4/5 of it
    assert 8 <= len(steals) <= 10
    assert max(q[0].finish, q[1].finish) < 12.0 / 5 + 1.0


def test_verdict_trial_and_permanent_moves() -> None:
    k = Knowledge()
    state = {1: rules.USABLE, 2: rules.USABLE, 3: rules.UNREACHABLE, 4: rules.REMOVED}
    k.record(7, 1, "fam", 1.0)
    k.record(7, 2, "fam", 1.0)
    homed = job(7, permanent_node_id=1)
    # no home: settles where it ran
    assert rules.verdict(job(7), 2, k, state.get) == (2, None)
    # ran away from a reachable home and was not faster: reverted
    assert rules.verdict(homed, 2, k, state.get) == (1, None)
    # proved faster (by more than faster_by): permanent
    k.record(8, 1, "fam", 1.0)
    k.record(8, 2, "fam", 0.5)
    assert rules.verdict(job(8, permanent_node_id=1), 2, k, state.get) == (2, None)
    # home unreachable and not faster: the trial stays open
    k.record(9, 3, "fam", 1.0)
    k.record(9, 2, "fam", 1.0)
    assert rules.verdict(job(9, permanent_node_id=3), 2, k, state.get) == (3, 2)
    # home gone for good: permanent where it ran
    assert rules.verdict(job(9, permanent_node_id=4, trial_node_id=2), 2, k, state.get) == (
        2,
        None,
    )
    # the home failed it in this run: the new node is more reliable
    failed_home = job(7, permanent_node_id=1, failed_on=frozenset({1}))
    assert rules.verdict(failed_home, 2, k, state.get) == (2, None)
    # ran at home while a trial was open: decided if tried, kept if not
    assert rules.verdict(job(7, permanent_node_id=1, trial_node_id=2), 1, k, state.get) == (
        1,
        None,
    )
    assert rules.verdict(job(7, permanent_node_id=1, trial_node_id=5), 1, k, state.get) == (1, 5)


def test_slow_jobs_are_found() -> None:
    k = Knowledge()
    for i in range(9):
        k.record(i, 1, "fam", 0.1)
    k.record(9, 1, "fam", 2.0)
    assert rules.slow_reason(job(9), 1, 2.0, k, 3.0) == "much slower than average"
    assert rules.slow_reason(job(3), 1, 0.1, k, 3.0) is None
    k.record(9, 2, "fam", 2.0)  # it is slow elsewhere too: the job, not the node
    assert rules.slow_reason(job(9), 1, 2.0, k, 3.0) is None
    for d in (1.0, 1.0, 1.0, 5.0):
        k.record(20, 2, "fam", d)
    assert rules.slow_reason(job(20), 2, 5.0, k, 3.0) == "slower than before"


def test_trial_node_prefers_a_fast_node_never_tried() -> None:
    k = Knowledge()
    k.set_speeds({1: 1.0, 2: 1.0, 3: 3.0})
    k.record(1, 1, "fam", 1.0)
    ns = nodes(1.0, 1.0, 3.0)
    assert rules.trial_node(job(1), ns, k, exclude=1) == 3
    k.record(1, 3, "fam", 1.0)
    assert rules.trial_node(job(1), ns, k, exclude=1) == 2
    assert rules.trial_node(job(1), ns[:1], k, exclude=1) is None


def test_exploration_rate_and_new_node_share() -> None:
    rng = random.Random(1)
    k = Knowledge()
    ns = nodes(1.0, 1.0, 1.0, 1.0)
    jobs = [job(i, permanent_node_id=1) for i in range(1000)]
    moves = rules.explore(jobs, ns, k, 0.1, rng)
    assert 60 < len(moves) < 140 and all(n != 1 for _j, n in moves)
    assert rules.explore(jobs, ns, k, 0.0, rng) == []
    # nodes 1-3 ran the family, node 4 is new: it gets about a quarter as trial moves
    for n in (1, 2, 3):
        k.record(10_000 + n, n, "fam", 0.1)
    share = rules.new_node_share(jobs[:400], ns, k, "fam", rng)
    assert len(share) == 100 and {n for _j, n in share} == {4}
    # a node that comes back is not new (it has learned rows): no share
    k.record(10_004, 4, "fam", 0.1)
    assert rules.new_node_share(jobs[:400], ns, k, "fam", rng) == []


def test_backups_for_stragglers_only() -> None:
    k = Knowledge()
    k.record(1, 2, "fam", 0.1)
    slow, idle = nodes(1.0, 1.0)
    late = Running(11, job(1), 1, elapsed=1.0, expected=0.1)
    on_time = Running(12, job(2), 1, elapsed=0.1, expected=0.1)
    (pick,) = rules.pick_backups([late, on_time], [idle], k.expected, 2.0)
    assert pick[0] is late and pick[1] is idle
    # a copy that would not end sooner than the straggler (as long as it ran) is not made
    k.record(3, 2, "fam", 5.0)
    assert rules.pick_backups([Running(13, job(3), 1, 1.0, 0.1)], [idle], k.expected, 2.0) == []
    assert rules.pick_backups([late], [], k.expected, 2.0) == []


def test_lower_bound_timeouts_rules_and_tuning() -> None:
    nodes_ = {1: (1.0, 1), 2: (1.0, 1), 3: (2.0, 1), 4: (4.0, 1)}
    assert rules.lower_bound(80.0, 8.0, nodes_) == pytest.approx(10.0)
    assert rules.lower_bound(41.0, 40.0, nodes_) == pytest.approx(10.0)  # longest / fastest
    assert rules.lower_bound(1.0, 1.0, {}) is None
    assert rules.overdue({1: 0.0, 2: 9.0}, 10.0, 5.0) == [1]
    assert rules.overdue({1: 0.0}, 10.0, None) == []
    assert rules.allows(None, None, {})
    assert not rules.allows(False, None, {})
    assert rules.allows(True, {"labels": {"zone": "eu"}}, {"zone": "eu"})
    assert not rules.allows(True, {"labels": {"zone": "eu"}}, {"zone": "us"})
    tuning, params = Tuning.split({"explore": 0.5, "stickiness": 1.0}, timeout=3.0, idempotent=None)
    assert tuning.explore == 0.5 and tuning.timeout == 3.0 and params == {"stickiness": 1.0}


def summary(makespan: float, lower_bound: float, resumed: bool = False) -> RunSummary:
    return RunSummary("f", 1, 2, resumed, 10, 10, 0, 0, 5.0, makespan, lower_bound)


def test_the_makespan_ratio_is_shown_only_where_it_means_something() -> None:
    """Issue 24: never below 1 (0.82 after a takeover), never for tiny jobs (483)."""
    assert makespan_ratio(3.0, 2.0) == pytest.approx(1.5)
    assert summary(3.0, 2.0).ratio == pytest.approx(1.5)
    assert "= 1.50 x LB" in summary(3.0, 2.0).line()
    # A resumed run: the jobs in flight at the takeover ran partly before this master's
    # makespan began, so their work counts in the bound but not in the makespan.
    resumed = summary(0.82, 1.0, resumed=True)
    assert resumed.ratio is None and "x LB" not in resumed.line()
    assert summary(2.0, 1.0, resumed=True).ratio is None  # not even when it looks right
    # A bound that did not describe the makespan is not shown as a ratio under 1.
    assert makespan_ratio(0.82, 1.0) is None and summary(0.82, 1.0).ratio is None
    # Tiny jobs: the loop's own overhead is the makespan.
    assert makespan_ratio(0.483, 0.001) is None
    tiny = summary(0.483, 0.001)
    assert tiny.ratio is None and "x LB" not in tiny.line()
    assert makespan_ratio(0.2, MIN_LOWER_BOUND) == pytest.approx(0.2 / MIN_LOWER_BOUND)
    assert makespan_ratio(0.2, MIN_LOWER_BOUND * 0.99) is None
    # Unknown either way: no ratio.
    assert makespan_ratio(None, 1.0) is None and makespan_ratio(1.0, None) is None
