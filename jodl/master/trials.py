"""Homes and trial moves: where each job belongs, decided from what was learned.

A job's home (its permanent node) and its trial node change here only, through
the job book's ``set_home``, and are written to the reconstruction log before the
next cycle relies on them (so a restart keeps trial moves):

    make_trial_moves   when a cycle opens: decide open trials, explore, share to new nodes
    review_durations   after results: trial verdicts, and trial moves for slow jobs
    node_gone          a node removed for good: its trial moves become permanent
    lower_bound        after a run: node speeds learned again, the makespan's bound
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from concurrent.futures import Future

from ..log.records import PendingJob
from ..placement import NodeLoad
from . import rules
from .background import in_background
from .nodes import Nodes
from .parts import PartOf, Parts
from .records import ActiveRun, job_info

log = logging.getLogger("jodl.master")


class TrialMoves(PartOf):
    """Decides homes and trial moves; owns the results waiting for review."""

    def __init__(self, parts: Parts, nodes: Nodes, rng: random.Random) -> None:
        super().__init__(parts)
        self.store = parts.store
        self.book = parts.book
        self.nodes = nodes
        self.ledger = parts.ledger
        self.families = parts.families
        self.knowledge = parts.knowledge
        self.rng = rng
        #: (job, node, duration) of results committed since the last review.
        self.reviews: list[tuple[PendingJob, int, float]] = []
        #: run -> node -> [seconds, longest seconds] of the results committed there, for
        #: the lower bound (sums per node: nothing kept per job of a million-job run).
        self.run_works: dict[int, dict[int, list[float]]] = {}
        #: Nodes and their expected work per cycle at home, being read for a run's open.
        self._home_work: list[tuple[Sequence[NodeLoad], Future[dict[int, float]]]] = []

    def note(
        self, node_id: int, done: Sequence[tuple[PendingJob, float, tuple[int, float] | None]]
    ) -> None:
        """Results of jobs (job, seconds) on ``node_id`` are about to be committed: review
        them next, and count them into their runs' work on the node."""
        works = self.run_works
        run_id: int | None = None
        acc: list[float] = []
        for job, duration, _placed in done:
            if job.run_id is None:
                continue
            if job.run_id != run_id:  # a report's results are mostly of one run
                run_id = job.run_id
                per = works.get(run_id)
                if per is None:
                    per = works[run_id] = {}
                acc = per.setdefault(node_id, [0.0, 0.0])
            acc[0] += duration
            if duration > acc[1]:
                acc[1] = duration
        self.reviews.extend((job, node_id, duration) for job, duration, _placed in done)

    def make_trial_moves(
        self, active: ActiveRun, jobs: Sequence[PendingJob], home_work: bool = True
    ) -> None:
        """When a cycle opens: decide open trials, give new nodes a share, explore at random.

        ``home_work``: also ask for each node's expected work per cycle of the jobs whose
        home it is (weighted by how often each job is due), which placement sees once
        read (:meth:`settle_home_work`); the later windows of a large run leave it as
        its first window asked for it.
        """
        fam = active.family.name
        tuning = self.families.tuned(fam)
        nodes = self.nodes.candidates(fam)
        state = self.nodes.state
        for job in jobs:
            trial = job.trial_node_id
            if trial is None or job.permanent_node_id is None:
                continue
            tried = self.knowledge.learned(job.id, trial)
            if state(job.permanent_node_id) == rules.REMOVED or (tried and tried.count):
                # decide as if it had just run there: permanent, reverted or still open
                verdict = rules.verdict(
                    job_info(job), trial, self.knowledge, state, tuning.faster_by, tuning.min_gain
                )
                self.book.set_home(job, *verdict)
        shared: list[tuple[int, int]] = []
        known = [self.knowledge.family_mean(fam, n.id) is not None for n in nodes]
        if tuning.new_node_share and any(known) and not all(known):
            infos = [job_info(job) for job in jobs]
            shared = rules.new_node_share(infos, nodes, self.knowledge, fam, self.rng)
            for job_id, node_id in shared:
                self.book.set_home(self.book.jobs[job_id], node_id, None)  # its new home
        # Each job is explored with probability ``explore``: draw first, describe the few.
        drawn = [j for j in jobs if j.trial_node_id is None and self.rng.random() < tuning.explore]
        picked = [job_info(job) for job in drawn]
        moves = rules.explore(picked, nodes, self.knowledge, 1.0, self.rng)
        for job_id, node_id in moves:
            job = self.book.jobs[job_id]
            self.book.set_home(job, job.permanent_node_id, node_id)
        if moves or shared:
            log.info(
                "run %s#%d: %d jobs to new nodes, %d trial moves",
                fam,
                active.run.number,
                len(shared),
                len(moves),
            )
        self.ledger.write_homes()
        if not home_work:
            return
        self.ledger.writer.flush()  # the homes just decided count in the query below
        default = self.knowledge.family_mean(fam) or self.knowledge.default_duration
        family_id = active.family.id

        def read() -> dict[int, float]:
            period = self.store.cycle_period(family_id)
            return self.store.home_work(family_id, default, period)

        # Read beside the run's first steps, not before its first send: the query reads
        # every job of the family (1.2 s for a million), and placement only breaks ties
        # with it; nodes keep the last value until this one is read (settle_home_work).
        self._home_work.append((nodes, in_background(read, "home-work")))

    def settle_home_work(self) -> None:
        """Give nodes the expected work per cycle at home that the runs' opens asked for,
        once read (at the end of every step, from :meth:`RunKeeper.read_more`)."""
        waiting = []
        for nodes, asked in self._home_work:
            if not asked.done():
                waiting.append((nodes, asked))
                continue
            try:
                work = asked.result()
            except Exception as exc:  # noqa: BLE001 - a tie-breaker: the old values serve
                log.warning("reading the work at home of nodes failed: %s", exc)
                continue
            for node in nodes:
                node.home_work = work.get(node.id, 0.0)
        self._home_work = waiting

    def review_durations(self) -> int:
        """After results: decide trial moves, and give slow jobs a trial move elsewhere.

        A job that ran away from its home is on a trial move (permanent if faster
        there, reverted if its home is back and it was not); a job much slower
        than average, or slower than it used to be, gets a trial move to another
        node for its next run. Changes go to the log writer at once.
        """
        reviews, self.reviews = self.reviews, []
        trials = 0
        family, tuning = "", self.families.tuned("")
        usable = {s.id for s in self.nodes if s.usable}  # asked once, not per job
        for job, node_id, duration in reviews:
            if job.family != family:  # a report's results are mostly of one family
                family, tuning = job.family, self.families.tuned(job.family)
            if duration < tuning.slow_floor and job.trial_node_id is None:
                if job.permanent_node_id is None and (
                    job.run_id is not None or job.claim is not None
                ):
                    job.permanent_node_id = node_id  # the log wrote it with the result
                    continue
                if job.permanent_node_id == node_id:
                    continue  # ran at home, too short to be slow: nothing to decide
                if self._home_unbeatable(job, usable, tuning.min_gain):
                    continue  # ran away (for balance): its home stays, as the verdict says
            info = job_info(job)
            permanent, trial = rules.verdict(
                info, node_id, self.knowledge, self.nodes.state, tuning.faster_by, tuning.min_gain
            )
            reason = None
            if duration >= tuning.slow_floor:
                reason = rules.slow_reason(
                    info, node_id, duration, self.knowledge, tuning.slow_factor
                )
            if reason is not None and trial is None:
                target = rules.trial_node(
                    info, self.nodes.candidates(job.family), self.knowledge, node_id, self.rng
                )
                if target is not None:
                    trial = target
                    trials += 1
                    log.info(
                        "job %s %s on node %s: trial on node %s", job.key, reason, node_id, target
                    )
            self.book.set_home(job, permanent, trial)
        self.ledger.write_homes()
        return trials

    def _home_unbeatable(self, job: PendingJob, usable: set[int], min_gain: float) -> bool:
        """Whether ``job``, which ran away from its home (one of the ``usable`` nodes)
        where it takes less than ``min_gain``, stays at home: no node can be faster than
        that by ``min_gain``, so :func:`rules.verdict` says so too. Asked without the
        job's placement record or the verdict: about one no-op job in seven of a repeat
        cycle ran away, and their verdicts took a twentieth of its loop."""
        home = job.permanent_node_id
        if home not in usable or home in job.failed_on:
            return False
        was = self.knowledge.learned(job.id, home)  # type: ignore[arg-type]
        return was is not None and was.recent is not None and was.recent < min_gain

    def node_gone(self, node_id: int) -> None:
        """A node removed for good: its trial moves become permanent, its homes are freed."""
        self.ledger.write_homes()
        self.ledger.writer.flush()  # homes decided before are written before they are freed
        self.store.node_gone_for_good(node_id)
        for job in self.book.jobs.values():  # the same change in memory
            if job.permanent_node_id == node_id:
                job.permanent_node_id, job.trial_node_id = job.trial_node_id, None
            elif job.trial_node_id == node_id:
                job.trial_node_id = None

    def lower_bound(self, active: ActiveRun) -> float | None:
        """Learn node speeds again, then LB = max(work / speed, longest / fastest) of the run."""
        speeds = self.knowledge.learn_speeds()
        for node_id, speed in speeds.items():
            slot = self.nodes.get(node_id)
            if slot is not None and abs(slot.load.speed - speed) > 1e-9:
                slot.load.speed = speed
                self.store.update_node(node_id, speed=speed)
        works = self.run_works.pop(active.run.id, {})
        if not works:
            return None
        nodes = {
            s.id: (self.knowledge.speed(s.id), s.load.slots)
            for s in self.nodes
            if not s.removed and (s.usable or s.id in works)
        }
        speed_of = self.knowledge.speed
        return rules.lower_bound(
            sum(total * speed_of(n) for n, (total, _) in works.items()),
            max(longest * speed_of(n) for n, (_, longest) in works.items()),
            nodes,
        )
