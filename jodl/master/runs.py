"""Opening and finishing runs (cycles): their jobs into the book, their summary out."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Collection
from concurrent.futures import Future
from functools import partial

from ..agent.client import AgentLink
from ..exceptions import AgentUnavailable, Fenced
from ..log.models import ExecState, FamilyRow, Run, RunState
from ..log.records import Sent
from ..log.runs import RunWindow
from .background import in_background
from .balancer import Balancer
from .bytes_budget import run_bytes
from .nodes import Nodes
from .outcomes import Outcomes
from .parts import PartOf, Parts
from .records import ActiveRun, RunSummary, execution_row, job_info
from .rules import READ_STEP

log = logging.getLogger("jodl.master")


class RunKeeper(PartOf):
    """Opens runs (resuming what the log holds) and closes them with their summary."""

    def __init__(self, parts: Parts, nodes: Nodes, outcomes: Outcomes, balancer: Balancer) -> None:
        super().__init__(parts)
        self.store = parts.store
        self.book = parts.book
        self.nodes = nodes
        self.ledger = parts.ledger
        self.outcomes = outcomes
        self.balancer = balancer
        self.families = parts.families
        self.knowledge = parts.knowledge
        self.runs = parts.runs
        self.gauges = parts.gauges
        #: run -> ids of jobs read out of their order (a resumed run's jobs in flight),
        #: left out of its later windows.
        self.read_early: dict[int, set[int]] = {}
        #: Resumed runs whose trial moves are made at the end of their first step.
        self.trials_due: set[int] = set()
        #: Members of a run read at once (``JODL_RUN_WINDOW``).
        self.window = parts.settings.run_window
        #: run -> its (done, failed, dead) counts last written to the log.
        self._written: dict[int, tuple[int, int, int]] = {}
        #: run -> (where its next piece starts, whether it is read against the log,
        #: that piece being read beside the loop's steps): see :meth:`_read_ahead`.
        self._ahead: dict[int, tuple[tuple[int, int], bool, Future[RunWindow]]] = {}

    def open(self, run: Run, family: FamilyRow, resumed: bool) -> ActiveRun:
        """Load a run's first jobs without a committed result and re-attach logged executions.

        The family's settings and node rules are read again: a change an operator made
        (``jodl family set|allow|deny``) holds from the next cycle on.

        A run is read in windows (``JODL_RUN_WINDOW`` members, oldest due first): the
        next one when fewer than half a window of its jobs are left in the book
        (:meth:`read_more`, at the end of every step), so a master holds about a window
        of a million-job run, not all of it. A resumed run's first window is one batch
        per agent and the jobs of its logged executions (re-attached before any of them
        is placed again), so a restarted master sends within its first step; reading
        100,000 jobs takes about half a second. The cost: a window's jobs are ordered
        longest first (LPT) among themselves only, and jobs of a resumed run's first
        window get no new trial move.
        """
        self.families.setup(family, reload=True)
        self._ahead.pop(run.id, None)  # read for a run this master had open before
        counter = run_bytes(self.store.fenced_engine, family, run.id, resumed)
        sents: list[Sent] = []
        if resumed:
            sents = self.store.sent_executions([run.id])
            early = {x.job_id for x in sents}
            window = self.store.run_window(run, family.name, self.parts.first_batch(), also=early)
            self.read_early[run.id] = early
            self.trials_due.add(run.id)
        else:
            window = self.store.run_window(run, family.name, self.window, logged=False)
        jobs = window.jobs
        done_before = 0
        if resumed:
            done_before, _ = self.store.count_run(run.id)
        active = ActiveRun(
            run,
            family,
            total=len(jobs) + done_before,
            resumed=resumed,
            started=time.perf_counter(),
            done=done_before,
            remaining=len(jobs),
            unread_after=window.next_after,
        )
        self.runs[run.id] = active
        for job in jobs:
            self.book.hold(job)
        if resumed:
            self._reattach(sents)
        if counter is not None:
            self.outcomes.run_bytes[run.id] = counter
        if not resumed:
            self.balancer.trials.make_trial_moves(active, jobs)
        self._hold_back_if_stopped(run.id)
        self._read_ahead(active)
        log.info(
            "run %s#%d %s: %d jobs to do%s",
            family.name,
            run.number,
            "resumed" if resumed else "opened",
            len(jobs),
            " in its first window" if window.next_after is not None else "",
            extra={"run_id": run.id, "family": family.name},
        )
        return active

    def read_more(self) -> None:
        """Read the next windows of open runs with fewer than half a window of their jobs
        in the book, and make a resumed run's trial moves: at the end of every step,
        before any run's end is looked at. A window is read in pieces of what one step
        sends (:data:`~jodl.master.rules.READ_STEP`): 50,000 jobs read at once made one
        step of most of a second on 500 agents (bench/farm.py). Each piece was read
        ahead, beside the steps since the last one (:meth:`_read_ahead`)."""
        self.balancer.trials.settle_home_work()
        for active in list(self.runs.values()):
            run = active.run
            if (  # one piece a step
                active.unread_after is not None
                and not active.cancelled  # cancelled: the rest stays due
                and active.remaining < max(1, self.window // 2)
            ):
                window = self._next_piece(active)
                active.unread_after = window.next_after
                active.total += len(window.jobs)
                active.remaining += len(window.jobs)
                for job in window.jobs:
                    self.book.hold(job)
                if run.id not in self.trials_due:
                    self.balancer.trials.make_trial_moves(active, window.jobs, home_work=False)
                self._hold_back_if_stopped(run.id)
                self._read_ahead(active)
            if active.unread_after is None:
                self.read_early.pop(run.id, None)
            if run.id in self.trials_due and not active.cancelled:
                # a resumed run's first step is over: trial moves for all its jobs held
                self.trials_due.discard(run.id)
                held = [j for j in self.book.jobs.values() if j.run_id == run.id]
                self.balancer.trials.make_trial_moves(active, held)

    def _read_piece(self, active: ActiveRun, after: tuple[int, int]) -> RunWindow:
        """The piece of ``active``'s run that starts after ``after``."""
        return self._read(active, after, self.read_early.get(active.run.id, ()))

    def _read(self, active: ActiveRun, after: tuple[int, int], leave: Collection[int]) -> RunWindow:
        """:meth:`_read_piece` with what it leaves out given (any thread)."""
        return self.store.run_window(
            active.run,
            active.family.name,
            min(self.window, READ_STEP),
            after=after,
            leave=leave,
            logged=active.resumed,
        )

    def _read_ahead(self, active: ActiveRun) -> None:
        """Start reading ``active``'s next piece in a thread of its own, to be taken by
        :meth:`read_more` when the run needs it.

        The loop spent 3.4-3.9 µs of CPU a job on reading pieces, in a million-job cycle
        (bench/scale.py): rows decoded and made jobs while its calls to agents were out
        would have cost the steps nothing. A run's members do not change while it is
        open and a piece starts where the last one ended, so the piece read ahead is
        the one the step would read; it is taken only if that still holds (the same
        start, the same reading against the log)."""
        after = active.unread_after
        if after is None or active.cancelled:
            return
        # what it leaves out taken now, not in the reading thread
        leave = frozenset(self.read_early.get(active.run.id, ()))
        read = partial(self._read, active, after, leave)
        self._ahead[active.run.id] = (after, active.resumed, in_background(read, "run-window"))

    def _next_piece(self, active: ActiveRun) -> RunWindow:
        """The run's next piece: the one read ahead if it is that piece, else read now."""
        after = active.unread_after
        assert after is not None
        ahead = self._ahead.pop(active.run.id, None)
        if ahead is not None and ahead[0] == after and ahead[1] == active.resumed:
            return ahead[2].result()
        return self._read_piece(active, after)

    def _hold_back_if_stopped(self, run_id: int) -> None:
        counter = self.outcomes.run_bytes.get(run_id)
        if counter is not None and counter.stopped:
            self.outcomes.hold_back(run_id)

    def _reattach(self, sents: list[Sent]) -> None:
        """After a restart: keep executions agents still hold, close the others as lost.

        Two held executions of one job are a backup copy and its original only where
        backups are allowed (an idempotent family); otherwise the job has one
        execution too many (a master died between two writes): :meth:`_one_copy`.
        Every execution is attached before any is closed, so a dispatch closes only
        once none of its executions is held.
        """
        by_node: dict[int, list[Sent]] = defaultdict(list)
        for sent in sents:
            by_node[sent.node_id].append(sent)
        asks = {}  # one call per agent, all at once: a frozen agent delays nobody
        for node_id, group in by_node.items():
            slot = self.nodes.get(node_id)
            if slot is not None and slot.usable:
                asks[node_id] = partial(slot.link.held, self.epoch, [x.exec_id for x in group])
        replies = self.nodes.calls.each(asks)
        copies: dict[int, list[Sent]] = defaultdict(list)
        gone: list[tuple[Sent, str, str | None]] = []  # (execution, state, error)
        for node_id, group in by_node.items():
            slot = self.nodes.get(node_id)
            held: set[int] = set()
            if node_id in replies and slot is not None:
                try:
                    held = set(replies[node_id].get() or ())
                except Fenced:
                    raise  # a newer master took over: stop
                except AgentUnavailable:  # suspect: what it held is lost below
                    self.nodes.down(slot, self.epoch)
            for sent in group:
                if sent.exec_id in held and sent.job_id in self.book.jobs:
                    copies[sent.job_id].append(sent)
                else:
                    gone.append((sent, ExecState.LOST, "not held by its agent after a restart"))
        for job_id, held_copies in copies.items():
            job = self.book.jobs[job_id]
            if len(held_copies) > 1 and not self._backups_allowed(job.family, held_copies):
                held_copies, given_back = self._one_copy(held_copies)
                gone += [(x, ExecState.TAKEN_BACK, None) for x in given_back]
            first = None
            for sent in held_copies:
                if first is not None:  # a backup copy and its original: both run on
                    self.book.add_backup(sent, first.exec_id, first.node_id)
                    continue
                slot = self.nodes[sent.node_id]
                self.book.attach(sent, self.knowledge.expected(job_info(job), slot.load))
                first = sent
        rows = []
        for sent, state, error in gone:
            self.book.lost_after_restart(sent)
            rows.append(execution_row(sent.exec_id, sent, state, self.epoch, error=error))
        self.ledger.commit(rows)

    def _backups_allowed(self, family: str, held: list[Sent]) -> bool:
        """Whether copies of a ``family`` job may run side by side (as backups do)."""
        if not self.families.tuned(family).idempotent:
            return False
        return all(family in self.nodes[x.node_id].idempotent for x in held)

    def _one_copy(self, held: list[Sent]) -> tuple[list[Sent], list[Sent]]:
        """Two or more open executions of a job that must not run twice: every agent is
        asked to give back its copy unstarted; (copies that started, copies given back).
        None started: the job is placed again, once their closing rows are committed.
        More than one started: nothing can undo that; they are kept as copies."""
        given: set[int] = set()
        for sent in held:
            back = self.nodes.call(
                self.nodes[sent.node_id], self.epoch, AgentLink.take_back, self.epoch, 0,
                [sent.exec_id],
            )  # fmt: skip
            given.update(back or ())
        started = [x for x in held if x.exec_id not in given]
        if len(started) > 1:
            log.error(
                "job %d: %d executions had started before this master resumed the run",
                held[0].job_id,
                len(started),
            )
        return started, [x for x in held if x.exec_id in given]

    def record_progress(self) -> None:
        """Write the open runs' counts that changed since the last time (for ``jodl
        status`` and the run page while they run)."""
        for run_id, active in self.runs.items():
            counts = (active.done, active.failed, active.dead)
            if self._written.get(run_id) != counts:
                self.store.run_progress(run_id, *counts)
                self._written[run_id] = counts

    def finish(self, active: ActiveRun) -> RunSummary:
        """Close a run whose jobs are all done or dead: commit, acknowledge, summarise."""
        makespan = None
        if active.first_send is not None and active.last_result is not None:
            makespan = active.last_result - active.first_send
        lower_bound = self.balancer.trials.lower_bound(active)  # learns speeds too
        if active.resumed:
            # Jobs in flight at the takeover ran partly before this master's first send:
            # their work is in the bound, not in the makespan (the ratio read 0.82).
            lower_bound = None
        self.balancer.end_of_run()
        self.ledger.write_homes()
        self.ledger.writer.flush()  # every outcome and home of the run committed before it closes
        self.nodes.flush_acks(self.epoch)
        self.outcomes.run_bytes.pop(active.run.id, None)
        state = RunState.CANCELLED if active.cancelled else RunState.FINISHED
        run = self.store.finish_run(active.run, makespan, lower_bound, state)
        self.gauges.run_counts(active)
        self._written.pop(active.run.id, None)
        self._ahead.pop(active.run.id, None)
        self.read_early.pop(active.run.id, None)
        self.trials_due.discard(active.run.id)
        del self.runs[active.run.id]
        summary = RunSummary(
            family=active.family.name,
            run_id=run.id,
            number=run.number,
            resumed=active.resumed,
            total=active.total,
            done=run.jobs_done,
            failed=run.jobs_failed,
            dead=run.jobs_dead,
            elapsed=time.perf_counter() - active.started,
            makespan=makespan,
            lower_bound=lower_bound,
            cancelled=active.cancelled,
        )
        log.info("%s", summary.line(), extra={"run_id": run.id, "family": summary.family})
        return summary
