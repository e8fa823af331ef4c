"""The reconstruction log's gateway: every statement on the library's tables.

:class:`Store` is composed of one gateway per concern, each in its own module of
this package, and offers their methods under one name for the master and the
command line. Writes are batched (one statement per loop step, not per job) and
committed before the master acts on them (sends) or acknowledges results to the
agents, so a master killed at any point restarts from these tables alone.
Each table and the module holding its statements: docs/architecture.md#the-reconstruction-log.
"""

from __future__ import annotations

import copy
import datetime as dt
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, select
from sqlalchemy.orm import Session, sessionmaker

from ..obs import tracing
from ..placement import Knowledge
from .exec_ids import ExecIds
from .fence import fenced
from .jobs import JobLog
from .learning import Learning
from .lease import LEASE_SECONDS, WHOLE, Leases, holder_gone
from .masters import MasterRegistry
from .models import FamilyOnNode, FamilyRow, Node, RequestKind, Run, RunRequest, RunState
from .new_jobs import LinesAdded
from .nodes import Families, NodeLog
from .outcomes import OutcomeLog
from .reads import Reads
from .records import Home, OutcomeBatch, PendingJob, ProgressRow, RunResults, Sent
from .requests import Request, RequestLog
from .runs import Runs, RunWindow


class Store:
    """The reconstruction log of one database, as named reads and writes.

    Each statement has one door. Two parts are public, and no method here repeats
    theirs: ``masters`` (the registry of masters: heartbeats, who lives, leaving) and
    ``reads`` (what applications and status read: results since a cursor, latest
    results per job, runs and their executions). Every other statement is a method of
    this class, over private parts: ``_leases`` (leases, epochs, cluster id),
    ``_exec_ids`` (the execution-id sequence), ``_runs``, ``_outcomes`` (dispatches and
    outcome batches), ``_learning`` (what placement learned, homes), ``_families``,
    ``_node_log`` (nodes) and ``_requests`` (cycles asked of the running master).
    """

    def __init__(self, engine: Engine, epoch: Callable[[], int] | None = None) -> None:
        """``epoch``: where a master reads its lease epoch; every writing transaction
        then proves it (:mod:`jodl.log.fence`), except takes and renewals of leases,
        which prove it their own way, and heartbeats, which any master writes."""
        self.engine = engine
        self.dialect = engine.dialect.name
        self._bind(epoch)

    def _bind(self, epoch: Callable[[], int] | None) -> None:
        engine = self.engine
        #: The engine the gateways use: ``engine`` itself, or its fenced view.
        self.fenced_engine = engine if epoch is None else fenced(engine, epoch)
        writes = self.fenced_engine
        self.sessions = sessionmaker(writes, expire_on_commit=False)
        self._leases = Leases(engine)
        self.masters = MasterRegistry(engine)
        self._exec_ids = ExecIds(writes)
        self._runs = Runs(writes)
        self._outcomes = OutcomeLog(writes)
        self._learning = Learning(writes)
        self._families = Families(writes)
        self._node_log = NodeLog(writes)
        self._requests = RequestLog(writes)
        self.reads = Reads(engine)

    def fenced(self, epoch: Callable[[], int] | None) -> Store:
        """This store (a copy, of the same class) as the master whose lease epoch
        ``epoch()`` reads writes it; None: unfenced."""
        twin = copy.copy(self)
        twin._bind(epoch)
        return twin

    def unfenced(self) -> Store:
        """This database for writes any master may make (a node's hello, say)."""
        return self if self.fenced_engine is self.engine else self.fenced(None)

    def session(self) -> Session:
        return self.sessions()

    def ping(self) -> None:
        """One round trip to the database; raises when it does not answer."""
        with self.engine.connect() as conn:
            conn.exec_driver_sql("SELECT 1")

    # -- master lease, epochs and execution ids ---------------------------------------

    def acquire_lease(
        self, holder: str, name: str = WHOLE, force: bool = False, ttl: float = LEASE_SECONDS
    ) -> int:
        """Take one lease (by default the whole database's); the new epoch (see
        :meth:`Leases.acquire`)."""
        return self._leases.acquire(holder, name, force, ttl)

    def lease_holder(self, name: str | None = None) -> str | None:
        """Who holds a live lease on ``name`` (None: any; a master runs); None: nobody."""
        return self._leases.holder(name)

    def running_master(self) -> str | None:
        """A master that runs on this database (one holding a lease, else a live
        standby, which leads a family as soon as there is one); None: nobody."""
        holder = self._leases.holder()
        if holder is not None:
            return holder
        return next((m for m in self.masters.live() if not holder_gone(m)), None)

    def renew_lease(
        self, holder: str, epoch: int, name: str | Sequence[str] = WHOLE, ttl: float = LEASE_SECONDS
    ) -> bool:
        """Extend our leases; False when another master has taken one (we are fenced)."""
        del holder  # the epoch names the holder: a takeover makes a new one
        return self._leases.renew(epoch, name, ttl)

    def release_lease(self, epoch: int, name: str | Sequence[str] = WHOLE) -> None:
        """End our leases now (a clean stop): the next master need not wait for them."""
        self._leases.release(epoch, name)

    def take_leases(
        self,
        holder: str,
        wanted: Sequence[str],
        kept: Sequence[str] = (),
        epoch: int = 0,
        force: bool = False,
        ttl: float = LEASE_SECONDS,
    ) -> tuple[int, list[str], dict[str, tuple[str, float]]]:
        """Take the free scopes of ``wanted`` at once (see :meth:`Leases.take`)."""
        return self._leases.take(holder, wanted, kept, epoch, force, ttl)

    def leases(self) -> list[tuple[str, str, int, dt.datetime]]:
        """Every lease row: (scope, holder, epoch, expires_at), by scope (for status)."""
        return self._leases.leases()

    def running_families(self) -> list[str]:
        """Names of the families with an unfinished run."""
        return self._runs.running_families()

    def run_ended_since(self, family: str, since: dt.datetime) -> Run | None:
        """The family's last run that ended at or after ``since`` (None: none did)."""
        return self._runs.ended_since(family, since)

    def family_names(self) -> list[str]:
        """Names of every family, sorted (what serving masters spread among them)."""
        with self.engine.connect() as conn:
            return list(conn.scalars(select(FamilyRow.name).order_by(FamilyRow.name)))

    def adopt_run_requests(
        self, leader: str, families: Sequence[str] | None = None
    ) -> list[tuple[int, str]]:
        """Requests another master took and did not settle become ``leader``'s (of
        ``families``; None: all): (request id, family) pairs."""
        return self._requests.adopt(leader, families)

    def newest_epoch(self) -> int:
        """The newest epoch the database issued: an agent fenced by a newer one was lied to."""
        return self._leases.newest_epoch()

    def cluster_id(self) -> str:
        """This database's cluster id, drawn on first use."""
        return self._leases.cluster_id()

    def next_exec_ids(self, count: int) -> list[int]:
        """``count`` fresh execution ids (allocated in committed blocks, never reused)."""
        return self._exec_ids.take(count)

    def next_free_exec_id(self) -> int:
        """Every execution id handed out from now on is at least this (tests and tools)."""
        return self._exec_ids.next_free()

    # -- families, nodes and jobs ---------------------------------------------------------

    def ensure_family(self, name: str, **fields: Any) -> FamilyRow:
        return self._families.ensure_family(name, **fields)

    def family(self, name: str) -> FamilyRow | None:
        return self._families.family(name)

    def family_rules(self, family_id: int) -> dict[int, FamilyOnNode]:
        return self._families.family_rules(family_id)

    def set_payloads(self, rows: Sequence[Mapping[str, Any]], conn: Connection) -> None:
        """New payloads and priorities of jobs (rows of ``id``, ``payload``, ``priority``),
        in the caller's transaction ``conn``."""
        self._families.set_payloads(rows, conn)

    def add_jobs(
        self,
        family: FamilyRow | str,
        jobs: Iterable[tuple[str, Any]] | Mapping[str, Any],
        priority: int | None = None,
        create: bool = False,
    ) -> int:
        """Add jobs to a family; the number added (see :meth:`Families.add_jobs`): a
        family named that is not in the database is refused unless ``create``; a
        payload that is not a JSON object is refused, and nothing is added."""
        if not tracing.state.on:
            return self._families.add_jobs(family, jobs, priority, create)
        rows = list(jobs.items() if isinstance(jobs, Mapping) else jobs)
        added = self._families.add_jobs(family, rows, priority, create)
        name = family if isinstance(family, str) else family.name
        with self.engine.connect() as conn:  # traces on: one read for the jobs' ids
            found = JobLog.ids_of_keys(conn, name, [key for key, _ in rows])
        tracing.added(name, found.items())
        return added

    def add_job_lines(self, family: str, lines: bytes, **fields: Any) -> LinesAdded | None:
        """Add the jobs of JSON Lines text to ``family`` (created with ``fields`` if new),
        the lines parsed by PostgreSQL: (added, given), or None where that is not done and
        nothing was written (see :meth:`Families.add_job_lines`): the caller reads the
        lines itself. Traces on: None, so that :meth:`add_jobs` traces each job."""
        if tracing.state.on:
            return None
        return self._families.add_job_lines(family, lines, **fields)

    def record_progress(self, rows: Sequence[ProgressRow]) -> None:
        """Running executions' newest progress reports (see :meth:`Runs.record_progress`)."""
        self._runs.record_progress(rows)

    def nodes(self, include_removed: bool = False) -> list[Node]:
        return self._node_log.nodes(include_removed)

    def add_node(self, address: str, slots: int = 1, labels: dict[str, Any] | None = None) -> Node:
        """Register (or re-activate) a node; a node coming back keeps its id and learning."""
        return self._node_log.add_node(address, slots, labels)

    def remove_node(self, address: str) -> bool:
        return self._node_log.remove_node(address)

    def greet_node(self, address: str, slots: int, labels: dict[str, str]) -> Node:
        """An agent's hello: the node as it says it is (see :meth:`NodeLog.greet_node`)."""
        return self._node_log.greet_node(address, slots, labels)

    def drain_node(self, address: str) -> bool:
        """Mark a live node draining; False if there is none at ``address``."""
        return self._node_log.drain_node(address)

    def update_node(self, node_id: int, **values: Any) -> None:
        self._node_log.update_node(node_id, **values)

    def record_ops(self, node_id: int, address: str) -> None:
        """Where the node's agent serves health and /metrics (:data:`jodl.log.nodes.OPS_LABEL`)."""
        self._node_log.record_ops(node_id, address)

    def nodes_seen(self, node_ids: Sequence[int], at: dt.datetime) -> None:
        """Set the ``last_seen`` of ``node_ids`` to ``at``, in one statement."""
        self._node_log.seen(node_ids, at)

    def node_key_range(self, address: str) -> tuple[int, int]:
        """The generations of the node's key masters accept (:mod:`jodl.agent.keys`)."""
        return self._node_log.key_range(address)

    def rekey_node(self, address: str, keep_old: bool = False) -> tuple[int, int] | None:
        """Draw the node's next key generation (see :meth:`NodeLog.rekey`)."""
        return self._node_log.rekey(address, keep_old)

    def drop_old_node_keys(self, address: str) -> tuple[int, int] | None:
        """Accept only the node's newest key generation (see :meth:`NodeLog.drop_old_keys`)."""
        return self._node_log.drop_old_keys(address)

    def ask_reload(self, address: str | None = None) -> list[str]:
        """Ask the agent at ``address`` (None: every live node's) to reload its installed
        families; the addresses asked. The running master relays it within a second."""
        return self._node_log.ask_reload(address)

    def reloads_asked(self) -> dict[int, dt.datetime]:
        return self._node_log.reloads_asked()

    def reload_relayed(self, node_id: int, asked_at: dt.datetime) -> None:
        self._node_log.reload_relayed(node_id, asked_at)

    # -- runs ---------------------------------------------------------------------------------

    def open_run(self, family: FamilyRow, epoch: int) -> tuple[Run, bool]:
        """The family's unfinished run (resumed: True) or a new one with its due jobs."""
        return self._runs.open_run(family, epoch)

    def run_jobs(self, run: Run, family_name: str) -> list[PendingJob]:
        """Every job of ``run`` with no committed result, with its attempts so far in it."""
        return self._runs.run_jobs(run, family_name)

    def run_window(
        self,
        run: Run,
        family_name: str,
        size: int,
        after: tuple[int, int] | None = None,
        also: Collection[int] = (),
        leave: Collection[int] = (),
        logged: bool = True,
    ) -> RunWindow:
        """The next ``size`` members of ``run`` after ``after`` (see
        :meth:`Runs.run_window <jodl.log.runs.Runs.run_window>`)."""
        return self._runs.run_window(run, family_name, size, after, also, leave, logged)

    def sent_executions(self, run_ids: Sequence[int | None]) -> list[Sent]:
        """Executions of open dispatches of these runs (None: on-demand) with no outcome."""
        return self._runs.sent_executions(run_ids)

    def running_runs(self) -> int:
        return self._runs.running_runs()

    def running_run(self, family: str) -> Run | None:
        return self._runs.running_run(family)

    def run_progress(self, run_id: int, done: int, failed: int, dead: int) -> None:
        self._runs.run_progress(run_id, done, failed, dead)

    def count_run(self, run_id: int) -> tuple[int, int]:
        return self._runs.count_run(run_id)

    def set_run_unserved(self, run_id: int, why: str | None) -> None:
        """Why no live agent runs the open run's jobs now (None: one does)."""
        self._runs.set_unserved(run_id, why)

    def finish_run(
        self,
        run: Run,
        makespan: float | None,
        lower_bound: float | None,
        state: str = RunState.FINISHED,
    ) -> Run:
        return self._runs.finish_run(run, makespan, lower_bound, state)

    def cancel_open_run(self, family: str) -> Run | None:
        """No master runs it: record the family's unfinished run as cancelled; the run."""
        run = self._runs.running_run(family)
        if run is None:
            return None
        return self._runs.finish_run(run, None, None, RunState.CANCELLED)

    def results(self, family: str, run: int | None = None) -> RunResults:
        """What run number ``run`` of ``family`` (default: its newest) gave, per job."""
        return self._runs.results(family, run)

    # -- outcomes (the hot path: one statement per step) -----------------------------------

    def record_dispatches(self, rows: list[dict[str, Any]]) -> None:
        """Log batches about to be sent (write-ahead): id, run_id, node_id, epoch, items."""
        self._outcomes.record_dispatches(rows)

    def record_outcomes(self, *batches: OutcomeBatch) -> None:
        """Commit batches of outcomes, and what they teach, in one transaction."""
        self._outcomes.record(*batches)

    def settled(self, exec_ids: Sequence[int]) -> set[int]:
        """Which of ``exec_ids`` have an outcome in the log."""
        return self._outcomes.settled(exec_ids)

    # -- what placement learned ------------------------------------------------------------

    def load_knowledge(self, knowledge: Knowledge) -> None:
        self._learning.load_knowledge(knowledge)

    def set_homes(self, rows: Sequence[Home | tuple[int, int | None, int | None]]) -> None:
        self._learning.set_homes(rows)

    def node_gone_for_good(self, node_id: int) -> None:
        self._learning.node_gone_for_good(node_id)

    def home_work(self, family_id: int, default: float, period: float | None) -> dict[int, float]:
        return self._learning.home_work(family_id, default, period)

    def cycle_period(self, family_id: int, runs: int = 6) -> float | None:
        return self._learning.cycle_period(family_id, runs)

    # -- cycles asked of the running master ---------------------------------------------------

    def request_run(self, family: str, kind: str = RequestKind.RUN) -> int:
        return self._requests.request_run(family, kind)

    def take_run_requests(
        self, taker: str, families: Sequence[str] | None = None
    ) -> list[tuple[int, str]]:
        return self._requests.take_run_requests(taker, families)

    def take_requests(
        self, taker: str, kinds: Sequence[str], families: Sequence[str] | None = None
    ) -> list[Request]:
        return self._requests.take_requests(taker, kinds, families)

    # -- deleting jobs -----------------------------------------------------------------------

    def delete_jobs(self, family: str, keys: Sequence[str]) -> list[str]:
        """Delete these jobs of ``family`` (never dispatched again; a running master
        cancels those it holds); the keys it had, the others are ignored."""
        with self.engine.begin() as conn:
            found = JobLog.ids_of_keys(conn, family, keys)
            JobLog.delete(conn, list(found.values()))
        return sorted(found)

    def deleted_among(self, job_ids: Sequence[int]) -> list[int]:
        """Which of ``job_ids`` are deleted."""
        with self.engine.connect() as conn:
            return JobLog.deleted_among(conn, job_ids)

    def settle_run_request(self, request_id: int, taker: str, **outcome: Any) -> None:
        self._requests.settle_run_request(request_id, taker, **outcome)

    def run_request(self, request_id: int) -> RunRequest | None:
        return self._requests.run_request(request_id)
