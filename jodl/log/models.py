"""Tables of the reconstruction log, as typed SQLAlchemy 2 models (docs/architecture.md).

Names follow the project's terms: Node, Family, FamilyOnNode, Job, JobOnNode, Run, and the
execution log (one row per attempt of a job). Payloads and results are JSON text.
What a row of each table is and who writes it: docs/architecture.md#the-reconstruction-log.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# BigInteger ids that are still INTEGER PRIMARY KEY (rowid aliases) on SQLite.
BigId = BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSON, dt.datetime: DateTime()}


def table_of(model: type[Base]) -> Table:
    """The Core table of a model (for the bulk statements, which work on tables)."""
    return cast(Table, model.__table__)


class NodeState:
    ACTIVE = "active"  # reachable, takes jobs
    SUSPECT = "suspect"  # calls failed: no new jobs, retried; gone after JODL_NODE_GRACE
    UNREACHABLE = "unreachable"  # gone: its jobs were lost and placed again; retried
    DRAINING = "draining"  # finishes what it has, takes nothing new
    REMOVED = "removed"  # gone for good; trial moves away from it become permanent


class Node(Base):
    """An agent the master can call."""

    __tablename__ = "jodl_node"
    id: Mapped[int] = mapped_column(primary_key=True)
    address: Mapped[str] = mapped_column(String(255), unique=True)
    state: Mapped[str] = mapped_column(String(16), default=NodeState.ACTIVE)
    slots: Mapped[int] = mapped_column(Integer, default=1)
    labels: Mapped[dict[str, Any]] = mapped_column(default=dict)
    #: Learned speed relative to the cluster (1.0 = average); placement uses it.
    speed: Mapped[float] = mapped_column(Float, default=1.0)
    families: Mapped[dict[str, Any]] = mapped_column(default=dict)
    last_seen: Mapped[dt.datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    retry_at: Mapped[dt.datetime | None]
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    #: ``jodl node reload`` asked its agent to reload its families; cleared once the
    #: running master relayed it.
    reload_asked_at: Mapped[dt.datetime | None]
    #: The newest generation of the node's key (``jodl node rekey``; 0: never rekeyed)
    #: and the oldest one masters still accept (:mod:`jodl.agent.keys`).
    key_generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    key_oldest: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class FamilyRow(Base):
    """A group of jobs run by one family class, with its placement and schedule."""

    __tablename__ = "jodl_family"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    strategy: Mapped[str] = mapped_column(String(100), default="earliest_finish")
    strategy_params: Mapped[dict[str, Any]] = mapped_column(default=dict)
    schedule: Mapped[str | None] = mapped_column(String(100))
    max_attempts: Mapped[int | None] = mapped_column(Integer)
    timeout: Mapped[float | None] = mapped_column(Float)
    #: None: as the family class declares (``Family.idempotent``, the one source of
    #: truth); False: an operator turned backup copies off (``jodl family set
    #: --idempotent false``). True never allows what the class forbids.
    idempotent: Mapped[bool | None] = mapped_column(Boolean, default=None)
    settings: Mapped[dict[str, Any]] = mapped_column(default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class FamilyBudget(Base):
    """A family's budgets (:mod:`jodl.admin.budget`); NULL keeps the ``JODL_FAMILY_*`` default.

    ``hour_start``/``hour_used`` count the on-demand jobs claimed in the current
    clock hour; the queue's claims update them in their own transaction.
    """

    __tablename__ = "jodl_family_budget"
    family_id: Mapped[int] = mapped_column(
        ForeignKey("jodl_family.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    jobs_per_cycle: Mapped[int | None] = mapped_column(Integer)
    ondemand_per_hour: Mapped[int | None] = mapped_column(Integer)
    bytes_per_cycle: Mapped[int | None] = mapped_column(BigInteger)
    hour_start: Mapped[dt.datetime | None]
    hour_used: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class FamilyOnNode(Base):
    """Whether, and under which conditions, a node may run a family."""

    __tablename__ = "jodl_family_on_node"
    family_id: Mapped[int] = mapped_column(
        ForeignKey("jodl_family.id", ondelete="CASCADE"), primary_key=True
    )
    node_id: Mapped[int] = mapped_column(
        ForeignKey("jodl_node.id", ondelete="CASCADE"), primary_key=True
    )
    allowed: Mapped[bool] = mapped_column(Boolean, default=True)
    max_slots: Mapped[int | None] = mapped_column(Integer)
    conditions: Mapped[dict[str, Any]] = mapped_column(default=dict)


class JobState:
    IDLE = "idle"  # waits for its family's next cycle (or its due time)
    QUEUED = "queued"  # on-demand: due at ``due_at``
    CLAIMED = "claimed"  # on-demand: taken by a master under a lease
    DONE = "done"  # on-demand: result committed
    DEAD = "dead"  # failed too often; kept for inspection and re-queueing
    DELETED = "deleted"  # never dispatched again


class Job(Base):
    """One unit of work of a family, unique by (family, key).

    No foreign keys (migration jodl_0013): their per-row checks were a third of the
    cost of adding jobs in bulk. Deleting a family deletes its jobs, then its runs
    (:meth:`jodl.log.family_admin.FamilyAdminLog.remove`).
    """

    __tablename__ = "jodl_job"
    __table_args__ = (
        UniqueConstraint("family_id", "key", name="uq_jodl_job_family_key"),
        # Not idle: the on-demand queue's states, dead and deleted jobs. Idle jobs,
        # most of the table, are read by family (the unique key, ix_jodl_job_idle_due).
        Index(
            "ix_jodl_job_due",
            "state",
            "due_at",
            postgresql_where=text("state <> 'idle'"),
            sqlite_where=text("state <> 'idle'"),
        ),
        Index(
            "ix_jodl_job_run",
            "run_id",
            postgresql_where=text("run_id IS NOT NULL"),
            sqlite_where=text("run_id IS NOT NULL"),
        ),
    )
    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    family_id: Mapped[int] = mapped_column(Integer)
    key: Mapped[str] = mapped_column(String(2048))
    payload: Mapped[str] = mapped_column(Text, default="{}")
    priority: Mapped[int] = mapped_column(Integer, default=0)
    state: Mapped[str] = mapped_column(String(16), default=JobState.IDLE)
    #: Run the job only every N-th cycle of its family (1 = every cycle).
    every_n_cycles: Mapped[int] = mapped_column(Integer, default=1)
    #: ... and not more often than this many seconds.
    min_interval: Mapped[float | None] = mapped_column(Float)
    #: Queued (on demand): when it may be claimed. Idle (cycles): not before this time;
    #: a run that opens earlier leaves it out (None: due in any run), see
    #: :meth:`jodl.log.jobs.JobLog.set_due`.
    due_at: Mapped[dt.datetime | None]
    last_run_number: Mapped[int | None] = mapped_column(Integer)
    last_done_at: Mapped[dt.datetime | None]
    #: The job's home. No foreign key (nor on ``trial_node_id``): homes are rewritten
    #: for many jobs per cycle and the per-row check cost more than the update; nodes
    #: are only marked removed, and the master frees the homes of a node gone for good.
    permanent_node_id: Mapped[int | None] = mapped_column(Integer)
    #: Set while a trial move is in force; the permanent node is the one to return to.
    trial_node_id: Mapped[int | None] = mapped_column(Integer)
    #: Cycles: failed attempts in the current run. On demand: claims so far, never
    #: reset, so a result carrying an older attempt number is recognised as stale.
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    #: On demand: failures (errors and expired leases) since the job was last
    #: enqueued fresh; the job is dead when this reaches its family's max attempts.
    failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: The run in which the job last failed for good (set when it is declared dead).
    run_id: Mapped[int | None] = mapped_column(Integer)
    lease_until: Mapped[dt.datetime | None]
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


# The few jobs that run every N cycles or at most every T seconds (a run's end
# records when they last ran). On PostgreSQL jodl_job and jodl_job_on_node also
# keep half of each page free (migration 0005) so per-cycle updates stay HOT.
Index(
    "ix_jodl_job_frequency",
    Job.family_id,
    postgresql_where=text("every_n_cycles > 1 OR min_interval IS NOT NULL"),
    sqlite_where=text("every_n_cycles > 1 OR min_interval IS NOT NULL"),
)

# Idle jobs held back until a due time, by family: a family's earliest due one at once
# (Reads.next_due) without reading the many jobs that have none.
Index(
    "ix_jodl_job_idle_due",
    Job.family_id,
    Job.due_at,
    postgresql_where=text("state = 'idle' AND due_at IS NOT NULL"),
    sqlite_where=text("state = 'idle' AND due_at IS NOT NULL"),
)

# The on-demand queue's claim order among due jobs: highest priority, then earliest due.
Index(
    "ix_jodl_job_queue",
    Job.priority.desc(),
    Job.due_at,
    postgresql_where=text("state = 'queued'"),
    sqlite_where=text("state = 'queued'"),
)


class JobOnNode(Base):
    """What was learned about a job on a node: executions, failures, durations.

    No foreign keys, on purpose (as in :class:`Execution`): rows are written in
    bulk by the master only, and the constraint checks would cost more than the rows.
    """

    __tablename__ = "jodl_job_on_node"
    job_id: Mapped[int] = mapped_column(BigId, primary_key=True)
    node_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    executions: Mapped[int] = mapped_column(Integer, default=0)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    #: Mean duration over all executions (seconds).
    mean_duration: Mapped[float | None] = mapped_column(Float)
    #: Exponentially weighted recent duration (seconds).
    recent_duration: Mapped[float | None] = mapped_column(Float)
    #: Sum of squared deviations (Welford), for the spread.
    m2: Mapped[float] = mapped_column(Float, default=0.0)
    last_duration: Mapped[float | None] = mapped_column(Float)
    updated_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class RunState:
    RUNNING = "running"
    FINISHED = "finished"
    CANCELLED = "cancelled"  # ended by `jodl run cancel`: its unfinished jobs did not run


class Run(Base):
    """One cycle of a family: every due job executed once."""

    __tablename__ = "jodl_run"
    __table_args__ = (UniqueConstraint("family_id", "number", name="uq_jodl_run_family_number"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    family_id: Mapped[int] = mapped_column(ForeignKey("jodl_family.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), default=RunState.RUNNING)
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    finished_at: Mapped[dt.datetime | None]
    #: The family's newest job id when the run opened: later jobs wait for the next run.
    max_job_id: Mapped[int | None] = mapped_column(BigId)
    jobs_total: Mapped[int] = mapped_column(Integer, default=0)
    jobs_done: Mapped[int] = mapped_column(Integer, default=0)
    jobs_failed: Mapped[int] = mapped_column(Integer, default=0)
    jobs_dead: Mapped[int] = mapped_column(Integer, default=0)
    #: Wall seconds from the first send to the last result.
    makespan: Mapped[float | None] = mapped_column(Float)
    #: max(total work / total speed, longest job / fastest node), from learned figures.
    lower_bound: Mapped[float | None] = mapped_column(Float)
    ratio: Mapped[float | None] = mapped_column(Float)
    #: Due jobs a budget put off to the next run (jobs per cycle, bytes per cycle).
    deferred: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: With a jobs-per-cycle budget: the last member in the order (last run, id).
    cut_number: Mapped[int | None] = mapped_column(Integer)
    cut_job_id: Mapped[int | None] = mapped_column(BigId)
    #: Why its jobs wait while no live agent can run its family (None: one can), e.g.
    #: "no agent serves wordcount: installed on 0 of 2 agents" (jodl/master/coverage.py).
    unserved: Mapped[str | None] = mapped_column(Text)


class ExecState:
    SENT = "sent"  # in an open dispatch, no outcome yet (never stored as a row)
    DONE = "done"  # result committed
    FAILED = "failed"  # the agent reported an error
    TAKEN_BACK = "taken_back"  # handed back unstarted, given to another node
    LOST = "lost"  # the node went away with it
    CANCELLED = "cancelled"  # superseded (e.g. a backup copy lost the race) or job deleted


class Dispatch(Base):
    """A batch of executions sent to one agent, logged before the send (write-ahead).

    ``items`` is a JSON list of ``[exec_id, job_id, attempt]``. An execution of an
    open dispatch with no :class:`Execution` row is in flight: after a restart the
    master asks the agent whether it still holds it. A dispatch closes when all of
    its executions have an outcome row.
    """

    __tablename__ = "jodl_dispatch"
    __table_args__ = (
        Index(
            "ix_jodl_dispatch_open",
            "run_id",
            postgresql_where=text("is_open"),
            sqlite_where=text("is_open"),
        ),
    )
    #: The first execution id of the batch (execution ids are never reused).
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("jodl_run.id", ondelete="CASCADE"))
    node_id: Mapped[int | None] = mapped_column(ForeignKey("jodl_node.id", ondelete="SET NULL"))
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    sent_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    items: Mapped[str] = mapped_column(Text)
    is_open: Mapped[bool] = mapped_column(Boolean, default=True)


class Execution(Base):
    """The outcome of one attempt of a job (in a run, or on demand) on a node.

    Inserted once, when the outcome is known: done (result), failed (error),
    lost (node gone), taken back (moved unstarted), cancelled (superseded).

    The log's hottest table has no foreign keys, on purpose: it is append-only,
    written by the master alone from ids it holds, and the three constraint checks
    per row tripled the cost of a batch of outcomes.
    """

    __tablename__ = "jodl_execution"
    __table_args__ = (
        Index("ix_jodl_execution_run_state", "run_id", "state"),
        Index("ix_jodl_execution_job", "job_id"),
        # Exactly one committed result per job per run: the database enforces it.
        Index(
            "uq_jodl_execution_one_result",
            "run_id",
            "job_id",
            unique=True,
            postgresql_where=text("state = 'done' AND run_id IS NOT NULL"),
            sqlite_where=text("state = 'done' AND run_id IS NOT NULL"),
        ),
    )
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)
    run_id: Mapped[int | None] = mapped_column(Integer)
    job_id: Mapped[int] = mapped_column(BigId)
    node_id: Mapped[int | None] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    state: Mapped[str] = mapped_column(String(16), default=ExecState.SENT)
    backup: Mapped[bool] = mapped_column(Boolean, default=False)
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    sent_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    started_at: Mapped[dt.datetime | None]
    finished_at: Mapped[dt.datetime | None]
    duration: Mapped[float | None] = mapped_column(Float)
    result: Mapped[str | None] = mapped_column(Text)
    error: Mapped[str | None] = mapped_column(Text)


class JobProgress(Base):
    """How far a running execution is, as its job last said (``jodl.progress``), written
    by the master about once a second; a run's rows go when it ends."""

    __tablename__ = "jodl_progress"
    __table_args__ = (Index("ix_jodl_progress_run", "run_id"),)

    exec_id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)
    run_id: Mapped[int | None] = mapped_column(Integer)
    job_id: Mapped[int] = mapped_column(BigId)
    node_id: Mapped[int | None] = mapped_column(Integer)
    done: Mapped[float] = mapped_column(Float)
    total: Mapped[float | None] = mapped_column(Float)
    note: Mapped[str] = mapped_column(String(200), default="")
    reported_at: Mapped[dt.datetime] = mapped_column(default=utcnow)


class MasterLease(Base):
    """Which master leads; ``epoch`` grows with every takeover (agents fence older ones)."""

    __tablename__ = "jodl_master_lease"
    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    holder: Mapped[str] = mapped_column(String(255))
    epoch: Mapped[int] = mapped_column(Integer, default=0)
    expires_at: Mapped[dt.datetime]


class MasterNode(Base):
    """A live master (standby or leader): its heartbeat and the scopes it leads.

    Masters whose ``expires_at`` passed are not live: rendezvous hashing of the
    scopes (see :mod:`jodl.master.leadership`) counts live masters only.
    """

    __tablename__ = "jodl_master_node"
    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    role: Mapped[str] = mapped_column(String(20), default="standby")
    scopes: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    expires_at: Mapped[dt.datetime]


class ExecIdSequence(Base):
    """The next free execution id (:class:`jodl.log.exec_ids.ExecIds` takes them in blocks)."""

    __tablename__ = "jodl_exec_id"
    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    next_id: Mapped[int] = mapped_column(BigId, default=1)


class RequestKind:
    """What a :class:`RunRequest` asks of the running master."""

    RUN = "run"  # run a cycle of the family (`jodl run` beside a master)
    CANCEL = "cancel"  # end the family's running cycle (`jodl run cancel`)
    DELETE = "delete"  # some of the family's jobs were deleted: stop them (`jodl jobs delete`)


class RunRequest(Base):
    """Something asked of the running master about a family: a cycle (``jodl run``
    beside it), the end of its running cycle, or to stop its deleted jobs (``kind``).

    The master takes it (``taken_at``), acts and records the outcome
    (``finished_at`` with the run's summary line, or ``error``).
    """

    __tablename__ = "jodl_run_request"
    __table_args__ = (Index("ix_jodl_run_request_taken", "taken_at"),)
    id: Mapped[int] = mapped_column(primary_key=True)
    family: Mapped[str] = mapped_column(String(100))
    kind: Mapped[str] = mapped_column(
        String(16), default=RequestKind.RUN, server_default=RequestKind.RUN
    )
    requested_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
    taken_at: Mapped[dt.datetime | None]
    taken_by: Mapped[str | None] = mapped_column(String(255))
    run_id: Mapped[int | None] = mapped_column(Integer)
    finished_at: Mapped[dt.datetime | None]
    summary: Mapped[str | None] = mapped_column(Text)
    dead: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)


class Cluster(Base):
    """This database's identity, drawn once: agents bind the execution ids they remember
    to it, so a fresh database (numbering executions from 1 again) never meets old ids."""

    __tablename__ = "jodl_cluster"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    created_at: Mapped[dt.datetime] = mapped_column(default=utcnow)
