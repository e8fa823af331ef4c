"""Balancing rules of the master: the cost model, then the decisions as pure functions.

The functions here take a snapshot (queues, running executions, what was learned)
and return decisions; :class:`jodl.master.balancer.Balancer` gathers the snapshot
from the job book and carries the decisions out. Each rule is tested without agents.

Cost model
==========

Every figure the balancing decisions use, in seconds unless said otherwise:

* ``expected(job, node)`` — what placement's :class:`~jodl.placement.Knowledge`
  predicts: the job's recent duration on the node, else its mean elsewhere scaled
  by speeds, else the family's mean there, else the family's mean scaled by speed,
  else ``jodl.placement.DEFAULT_DURATION`` (0.5 s at speed 1.0: a job never seen
  is spread over the nodes like a job of moderate length, learned after one run).
* ``finish(node)`` — expected work the node still holds (queued and running,
  scaled by its *drift*: how much longer than expected its jobs took in this run)
  divided by its slots.
* ``rtt(node)`` — measured round trip of one call to its agent (moving mean).

**The steal inequality.** An idle node (the thief) takes the last-to-start job of
the node expected to finish last (the victim) when::

    finish(thief) + took + rtt(thief) [+ rtt(victim) if the agent must hand it back]
        + steal_margin + STEAL_SHARE * took   <   finish(victim)

where ``took = expected(job, thief)``. Every move ends the job earlier, so the
makespan never grows; the margin and the share keep noise from moving jobs.

**Thresholds.** A job ``slow_factor`` times slower than its own mean or the
family's mean there gets a trial move (not under ``slow_floor``); a trial move
becomes permanent when the new node is ``faster_by`` faster and by ``min_gain``
seconds at least; a running job ``backup_factor`` times past its expected duration
is a straggler and gets a backup copy on an idle node (idempotent families only)
when that copy is expected to end before the time it has run already.
The per-family knobs are the fields of :class:`Tuning` (a family's
``strategy_params``); the constants below hold for every family.
How balancing fits in the loop: docs/architecture.md#balancing.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from ..placement import JobInfo, Knowledge, NodeLoad

#: Seconds of expected work kept queued on an agent beyond its running slots: enough
#: that a slot never waits for the next loop step (a step takes about a millisecond
#: with hundreds of results), little enough that long jobs stay stealable here.
QUEUE_AHEAD = 0.5
#: An agent sent at most this many jobs ahead (its recent jobs were long) is sent
#: enough of its next ones to hold QUEUE_AHEAD of their expected work.
FEW_AHEAD = 16
#: Most jobs one loop step sends, all agents together, shared evenly among those with
#: jobs queued. A step's time grows with the jobs it sends (write-ahead rows, the
#: wire) and then collects: on 500 agents, each with room for a batch, one step sent a
#: whole cycle of 100,000 no-op jobs and the next collected it, seconds each, while
#: every agent waited for its next poll (bench/farm.py). 10,000 jobs make a step of
#: about half a second there; up to five agents still get full batches.
STEP_SEND = 10_000
#: Waiting jobs placed in one step at most (oldest first), the rest in the next steps: a
#: run's next window of 50,000 jobs placed at once made a step of about 0.7 s on 500
#: agents, in which no agent was polled (bench/farm.py). Twice a step's sends, so
#: placement never holds the sends back.
PLACE_STEP = 2 * STEP_SEND
#: Jobs of a run's next window read in one step at most (one piece a step): what a
#: step sends. Pieces of 20,000 made steps of 0.7–0.8 s on 500 agents, the longest an
#: agent holding jobs then waited for its next call was 0.95–1.03 s (bench/farm.py).
READ_STEP = STEP_SEND
#: Most waiting jobs of one node looked at per balance step (from the end of its
#: queue, where steals come from): bounds a step's work on a backlog of 100,000 jobs.
STEAL_WINDOW = 256
#: Share of a job's expected duration a steal must gain beyond the round trips and
#: ``steal_margin``: expectations err by about a tenth, a smaller gain is noise.
STEAL_SHARE = 0.1
#: A node steals once what its agent holds is expected to end within this many loop
#: steps: a node's end is seen only at a step's collect, and a steal reaches its
#: agent at the end of the step that planned it, so a node that waited until it was
#: idle would idle for up to a step and the steal's round trips (on a loaded machine,
#: steps of a few milliseconds each: most of what a cycle of short jobs lost above
#: its bound).
LEAD_STEPS = 2.0
#: Weight of the newest step in the moving mean of the loop's step time.
STEP_WEIGHT = 0.1
#: A pause between two steps longer than this (seconds: the loop waited for work)
#: counts as this much in that mean.
LEAD_CAP = 0.05
#: While jobs run, the master polls again within this share of the shortest one's
#: expected duration: a result is seen soon after it is ready (the makespan ends
#: only when the master sees the last result) without a tight loop for long jobs.
POLL_SHARE = 0.02
#: ... but not more often than this (seconds): one call per agent per millisecond.
POLL_FLOOR = 0.001

#: Node states as the balancing rules see them.
USABLE, UNREACHABLE, REMOVED = "usable", "unreachable", "removed"


@dataclass(frozen=True)
class Tuning:
    """The knobs of balancing, from a family's ``strategy_params`` (and its columns)."""

    #: A duration this many times the expected one triggers a trial move.
    slow_factor: float = 3.0
    #: Jobs shorter than this (seconds) are never moved for being slow.
    slow_floor: float = 0.05
    #: Share of a cycle's due jobs given a random trial move.
    explore: float = 0.02
    #: Failures of a job on one node (in a run) before it moves to another.
    attempts_before_move: int = 1
    #: Seconds a steal must gain beyond the round trips (plus STEAL_SHARE of the job):
    #: five milliseconds, a few loop steps, so a no-op job is never moved for nothing.
    steal_margin: float = 0.005
    #: A running job this many times past its expected duration is a straggler.
    backup_factor: float = 2.0
    #: How much faster a trial node must be for the move to become permanent.
    faster_by: float = 0.1
    #: ... and by at least this many seconds per run: below it, speed is timing noise
    #: (a job of microseconds would change homes at every cycle for nothing).
    min_gain: float = 0.001
    #: Give a node that never ran the family a share of the jobs as trial moves.
    new_node_share: bool = True
    #: Seconds an execution may take (the family's ``timeout``; None: no limit).
    timeout: float | None = None
    #: False: an operator forbade running its jobs twice (no backup copies); else as
    #: its class on each agent declares (:attr:`jodl.family.Family.idempotent`).
    idempotent: bool | None = None

    @classmethod
    def split(
        cls, params: Mapping[str, Any] | None, **family: Any
    ) -> tuple[Tuning, dict[str, Any]]:
        """(tuning, the strategy's own parameters) from a family's ``strategy_params``."""
        names = {f.name for f in fields(cls)}
        params = dict(params or {})
        knobs = {k: params.pop(k) for k in list(params) if k in names}
        try:
            tuning = cls(**knobs, **{k: v for k, v in family.items() if v is not None})
        except TypeError as exc:
            raise ValueError(f"bad balancing parameter: {exc}") from None
        return tuning, params


def allows(allowed: bool | None, conditions: Mapping[str, Any] | None, labels: Mapping) -> bool:
    """Whether a FamilyOnNode rule lets a node with ``labels`` run the family.

    No rule (``allowed`` None) allows; ``conditions={"labels": {...}}`` asks for
    those labels with those values.
    """
    if allowed is False:
        return False
    wanted = (conditions or {}).get("labels") or {}
    return all(str(labels.get(k)) == str(v) for k, v in wanted.items())


# -- stealing --------------------------------------------------------------------------------


@dataclass
class Stealable:
    """A job placed on a node that has not started (``sent``: it is on the agent already)."""

    job: JobInfo
    expected: float
    sent: bool = False
    exec_id: int | None = None


@dataclass
class NodeQueue:
    """One node as stealing sees it."""

    node: NodeLoad
    #: Seconds until the node is expected to have finished everything it holds.
    finish: float
    #: Its unstarted jobs, first to start first.
    waiting: list[Stealable] = field(default_factory=list)
    #: Measured round trip (seconds).
    rtt: float = 0.001
    idle: bool = False
    families: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Steal:
    """Move ``job_id`` from ``source`` to ``target`` (``exec_id``: ask the agent for it back)."""

    job_id: int
    source: int
    target: int
    exec_id: int | None
    gain: float


def plan_steals(
    queues: Sequence[NodeQueue],
    expected: Callable[[JobInfo, NodeLoad], float],
    margin: float | Callable[[JobInfo], float],
) -> list[Steal]:
    """Moves from the latest-finishing nodes to the idle ones, last-to-start jobs first.

    Idle nodes steal fastest first. A job moves only if it would end sooner on the
    thief, by more than the round trips (one more when the agent must hand it back)
    plus ``margin`` (seconds, or a function of the job) plus :data:`STEAL_SHARE` of
    its duration there (the steal inequality above), so the makespan never grows
    and a move is not made for noise. The victim is the node whose expected finish
    is latest (not the one with the most jobs).
    """
    out: list[Steal] = []
    thieves = sorted((q for q in queues if q.idle), key=lambda q: (-q.node.speed, q.node.id))
    for thief in thieves:
        slots = max(1, thief.node.slots)
        while True:
            victims = [q for q in queues if q is not thief and q.waiting]
            if not victims:
                break
            victim = max(victims, key=lambda q: (q.finish, -q.node.id))
            last = victim.waiting[-1]
            if last.job.family not in thief.families or thief.node.id in last.job.failed_on:
                break
            took = expected(last.job, thief.node)
            cost = thief.rtt + (victim.rtt if last.sent else 0.0)
            extra = margin(last.job) if callable(margin) else margin
            ends_there = thief.finish + took + cost + extra + STEAL_SHARE * took
            if ends_there >= victim.finish:
                break
            victim.waiting.pop()
            victim.finish -= last.expected / max(1, victim.node.slots)
            thief.finish += took / slots
            out.append(
                Steal(
                    last.job.id,
                    victim.node.id,
                    thief.node.id,
                    last.exec_id if last.sent else None,
                    victim.finish + last.expected - ends_there,
                )
            )
    return out


# -- timeouts --------------------------------------------------------------------------------


def overdue(running: Mapping[int, float], now: float, timeout: float | None) -> list[int]:
    """Execution ids (of ``{exec_id: started}``) out for longer than ``timeout`` seconds."""
    if not timeout:
        return []
    return [exec_id for exec_id, started in running.items() if now - started > timeout]


# -- trial and permanent moves ----------------------------------------------------------------


def verdict(
    job: JobInfo,
    ran_on: int,
    knowledge: Knowledge,
    state: Callable[[int], str],
    faster_by: float = 0.1,
    min_gain: float = 0.0,
) -> tuple[int | None, int | None]:
    """The job's (permanent node, trial node) after a success on ``ran_on``.

    A job with no home (or whose home is gone for good) settles where it ran. A
    job that ran away from home is on a trial move: permanent when the new node
    proved faster or the home failed it, reverted when the home is reachable and
    the new node was not faster, left open while the home is unreachable. A job
    that ran at home while a tried trial is open has that trial decided the same
    way; a trial not tried yet stays open.
    """
    home, trial = job.permanent_node_id, job.trial_node_id
    if home is None:
        return ran_on, None
    at_home = state(home)  # asked once: a repeat cycle decides this for many jobs
    if at_home == REMOVED:
        return ran_on, None
    if ran_on == home:
        if trial is None:
            return home, None
        tried = knowledge.learned(job.id, trial)
        if tried is None or not tried.count:
            return home, trial
        ran_on = trial
    if _better(job, ran_on, home, knowledge, faster_by, min_gain):
        return ran_on, None
    if at_home == USABLE:
        return home, None
    return home, ran_on


def _better(
    job: JobInfo, new: int, old: int, knowledge: Knowledge, faster_by: float, min_gain: float
) -> bool:
    if old in job.failed_on:
        return True  # the old node failed it in this run: the new one is more reliable
    was, now = knowledge.learned(job.id, old), knowledge.learned(job.id, new)
    if now is None or now.recent is None:
        return False
    if was is None or was.recent is None:
        return was is not None and was.failures > 0
    return now.recent < was.recent * (1.0 - faster_by) and was.recent - now.recent >= min_gain


def slow_reason(
    job: JobInfo, node_id: int, duration: float, knowledge: Knowledge, slow_factor: float
) -> str | None:
    """Why ``job`` should get a trial move after taking ``duration`` on ``node_id`` (or None).

    Slower than it used to be there (``slow_factor`` times its earlier mean, after
    at least two earlier runs), or much slower than the average job of its family
    on that node while it never ran anywhere else (a trial tells whether it is the
    job or the node). Call after the duration was recorded.
    """
    stat = knowledge.learned(job.id, node_id)
    if stat is None or not stat.count or stat.mean is None:
        return None
    if stat.count >= 3:
        before = (stat.mean * stat.count - duration) / (stat.count - 1)
        if before > 0 and duration > slow_factor * before:
            return "slower than before"
    ran_on = [n for n, st in knowledge.of_job(job.id).items() if st.count]
    family = knowledge.family_mean(job.family, node_id)
    if ran_on == [node_id] and family and duration > slow_factor * family:
        return "much slower than average"
    return None


def trial_node(
    job: JobInfo,
    candidates: Sequence[NodeLoad],
    knowledge: Knowledge,
    exclude: int | None = None,
    rng: random.Random | None = None,
) -> int | None:
    """Where to try ``job``: a node it never ran on (fastest first), else another random one."""
    others = [n for n in candidates if n.id != exclude and n.id not in job.failed_on]
    if not others:
        return None
    fresh = [n for n in others if not (st := knowledge.learned(job.id, n.id)) or not st.count]
    if fresh:
        best = max(knowledge.speed(n.id) for n in fresh)
        fresh = [n for n in fresh if knowledge.speed(n.id) >= best * 0.999]
        return (rng or random).choice(fresh).id
    return (rng or random).choice(others).id


def explore(
    jobs: Sequence[JobInfo],
    candidates: Sequence[NodeLoad],
    knowledge: Knowledge,
    rate: float,
    rng: random.Random,
) -> list[tuple[int, int]]:
    """(job, node) trial moves for about ``rate`` of ``jobs``, picked at random."""
    if rate <= 0 or len(candidates) < 2:
        return []
    out = []
    for job in jobs:
        if job.trial_node_id is None and rng.random() < rate:
            node = trial_node(job, candidates, knowledge, exclude=job.home, rng=rng)
            if node is not None:
                out.append((job.id, node))
    return out


def new_node_share(
    jobs: Sequence[JobInfo],
    candidates: Sequence[NodeLoad],
    knowledge: Knowledge,
    family: str,
    rng: random.Random,
) -> list[tuple[int, int]]:
    """(job, node) moves giving each node that never ran ``family`` its share of ``jobs``.

    The jobs are picked at random and the share follows the nodes' slots and
    speeds. Only when some other node did run the family (in the first cycle
    every node is new and placement spreads the jobs anyway). A node that comes
    back is not new: what was learned there is kept, so it gets its homes back.
    """
    seen = [n for n in candidates if knowledge.family_mean(family, n.id) is not None]
    new = [n for n in candidates if knowledge.family_mean(family, n.id) is None]
    if not seen or not new:
        return []
    capacity = sum(n.slots * max(n.speed, 1e-6) for n in candidates)
    pool = [j for j in jobs if j.trial_node_id is None]
    rng.shuffle(pool)
    out: list[tuple[int, int]] = []
    for node in new:
        share = round(len(jobs) * node.slots * max(node.speed, 1e-6) / capacity)
        for job in pool[:share]:
            out.append((job.id, node.id))
        pool = pool[share:]
    return out


# -- backups -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Running:
    """An execution running on a node, as backup decisions see it."""

    exec_id: int
    job: JobInfo
    node_id: int
    elapsed: float
    expected: float


def pick_backups(
    running: Sequence[Running],
    idle: Sequence[NodeLoad],
    expected: Callable[[JobInfo, NodeLoad], float],
    factor: float,
    rtt: float = 0.0,
) -> list[tuple[Running, NodeLoad]]:
    """Backup copies for stragglers: the longest-overdue first, one per idle node.

    A straggler has run ``factor`` times its expected duration. Its remaining time
    is unknown; it is assumed to be as long as it has run already (a job that is
    late tends to stay late), so a copy goes to an idle node only if it is
    expected to end there sooner than that.
    """
    free = sorted(idle, key=lambda n: (-n.speed, n.id))
    late = sorted(
        (r for r in running if r.elapsed > factor * r.expected),
        key=lambda r: -r.elapsed / max(r.expected, 1e-9),
    )
    out: list[tuple[Running, NodeLoad]] = []
    for run in late:
        options = [n for n in free if n.id != run.node_id and n.id not in run.job.failed_on]
        if not options:
            continue
        node = min(options, key=lambda n: (expected(run.job, n), n.id))
        if expected(run.job, node) + rtt < run.elapsed:
            out.append((run, node))
            free.remove(node)
    return out


# -- makespan ---------------------------------------------------------------------------------


def lower_bound(
    total: float, longest: float, nodes: Mapping[int, tuple[float, int]]
) -> float | None:
    """max(total work ÷ total speed, longest job ÷ fastest node), work measured at speed 1.0.

    ``nodes`` maps each node to (speed, slots); a node's capacity is speed × slots,
    but one job runs in one slot, so the longest job is bounded by the fastest speed.
    """
    capacity = sum(speed * max(1, slots) for speed, slots in nodes.values())
    if capacity <= 0:
        return None
    fastest = max(speed for speed, _slots in nodes.values())
    return max(total / capacity, longest / fastest)
