"""Nodes (agents the master calls) and families, with the rules joining them."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, insert, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import sessionmaker

from ..exceptions import BadPayload, UnknownFamily
from . import bulk
from .models import (
    FamilyOnNode,
    FamilyRow,
    Job,
    JobState,
    Node,
    NodeState,
    table_of,
    utcnow,
)

#: The node label that holds where the node's agent serves its ops endpoint (health,
#: /metrics), HOST:PORT, as the agent told its master in ``init``. A label, not a column
#: of its own: it describes the node as labels do, rides in the row the master writes on
#: every connect, and a placement rule may even ask for it. Hellos and ``jodl node add``
#: keep it (they do not know it); the next connect replaces it.
OPS_LABEL = "jodl.ops"


def _keep_ops(old: dict[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """``new`` labels, with the ops address of ``old`` unless ``new`` names one."""
    if old and OPS_LABEL in old and OPS_LABEL not in new:
        return {**new, OPS_LABEL: old[OPS_LABEL]}
    return new


class NodeLog:
    """Reads and writes of nodes."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)

    def nodes(self, include_removed: bool = False) -> list[Node]:
        with self.sessions() as s:
            q = select(Node).order_by(Node.id)
            if not include_removed:
                q = q.where(Node.state != NodeState.REMOVED)
            return list(s.scalars(q))

    def add_node(self, address: str, slots: int = 1, labels: dict[str, Any] | None = None) -> Node:
        """Register (or re-activate) a node; a node coming back keeps its id and learning."""
        with self.sessions() as s, s.begin():
            node = s.scalar(select(Node).where(Node.address == address))
            if node is None:
                node = Node(address=address, slots=slots, labels=labels or {})
                s.add(node)
            else:
                node.state = NodeState.ACTIVE
                node.retry_at = None
                node.failures = 0
                if labels:
                    node.labels = _keep_ops(node.labels, labels)
            s.flush()
            return node

    def greet_node(self, address: str, slots: int, labels: dict[str, str]) -> Node:
        """An agent's hello: record the node with the slots and labels it says it has.

        A node the master gave up on (unreachable, removed) is active again, so the
        master retries it at once; a draining node stays draining.
        """
        with self.sessions() as s, s.begin():
            node = s.scalar(select(Node).where(Node.address == address))
            if node is None:
                node = Node(address=address, slots=slots, labels=labels)
                s.add(node)
            else:
                if node.state != NodeState.DRAINING:
                    node.state = NodeState.ACTIVE
                    node.retry_at = None
                    node.failures = 0
                node.slots = slots
                node.labels = _keep_ops(node.labels, labels)
            s.flush()
            return node

    def record_ops(self, node_id: int, address: str) -> None:
        """The node's agent serves its ops endpoint at ``address`` ("": none)."""
        with self.sessions() as s, s.begin():
            node = s.get(Node, node_id, with_for_update=True)
            if node is None or (node.labels or {}).get(OPS_LABEL, "") == address:
                return
            labels = {k: v for k, v in (node.labels or {}).items() if k != OPS_LABEL}
            node.labels = {**labels, OPS_LABEL: address} if address else labels

    def seen(self, node_ids: Sequence[int], at: dt.datetime) -> None:
        """The master heard from each of ``node_ids`` (one statement for all of them)."""
        if not node_ids:
            return
        with self.engine.begin() as conn:
            conn.execute(update(Node).where(Node.id.in_(list(node_ids))).values(last_seen=at))

    def drain_node(self, address: str) -> bool:
        """Mark a node draining (it gets nothing new); False if there is no such live node."""
        with self.engine.begin() as conn:
            res = conn.execute(
                update(Node)
                .where(Node.address == address, Node.state != NodeState.REMOVED)
                .values(state=NodeState.DRAINING)
            )
            return res.rowcount > 0

    def remove_node(self, address: str) -> bool:
        with self.engine.begin() as conn:
            res = conn.execute(
                update(Node).where(Node.address == address).values(state=NodeState.REMOVED)
            )
            return res.rowcount > 0

    def update_node(self, node_id: int, **values: Any) -> None:
        with self.engine.begin() as conn:
            conn.execute(update(Node).where(Node.id == node_id).values(**values))

    def key_range(self, address: str) -> tuple[int, int]:
        """The generations of the key of the node at ``address`` that masters accept:
        (oldest, newest); (0, 0) for a node never rekeyed or not in the log."""
        with self.engine.connect() as conn:
            row = conn.execute(
                select(Node.key_oldest, Node.key_generation).where(Node.address == address)
            ).first()
        return (row[0], row[1]) if row is not None else (0, 0)

    def rekey(self, address: str, keep_old: bool = False) -> tuple[int, int] | None:
        """Draw the next generation of the key of the node at ``address``; the accepted
        range now, None if there is no such node. The older generations are refused from
        now on, unless ``keep_old`` (a rollover: until :meth:`drop_old_keys`)."""
        newest = Node.key_generation + 1
        with self.engine.begin() as conn:
            row = conn.execute(
                update(Node)
                .where(Node.address == address)
                .values(key_generation=newest, key_oldest=Node.key_oldest if keep_old else newest)
                .returning(Node.key_oldest, Node.key_generation)
            ).first()
        return (row[0], row[1]) if row is not None else None

    def drop_old_keys(self, address: str) -> tuple[int, int] | None:
        """Refuse every generation of the node's key but its newest; the range, or None."""
        with self.engine.begin() as conn:
            row = conn.execute(
                update(Node)
                .where(Node.address == address)
                .values(key_oldest=Node.key_generation)
                .returning(Node.key_oldest, Node.key_generation)
            ).first()
        return (row[0], row[1]) if row is not None else None

    def ask_reload(self, address: str | None = None) -> list[str]:
        """Ask the agent at ``address`` (None: of every live node) to reload its families;
        the addresses asked (none: no such live node). The running master relays it."""
        live = Node.state.in_((NodeState.ACTIVE, NodeState.UNREACHABLE, NodeState.SUSPECT))
        where = [live] if address is None else [live, Node.address == address]
        with self.engine.begin() as conn:
            asked = list(conn.scalars(select(Node.address).where(*where).order_by(Node.id)))
            if asked:
                conn.execute(
                    update(Node).where(Node.address.in_(asked)).values(reload_asked_at=utcnow())
                )
        return asked

    def reloads_asked(self) -> dict[int, dt.datetime]:
        """node id -> when its reload was asked, for the nodes whose reload is not relayed yet."""
        with self.engine.connect() as conn:
            return dict(
                conn.execute(  # type: ignore[arg-type]
                    select(Node.id, Node.reload_asked_at).where(Node.reload_asked_at.is_not(None))
                ).all()
            )

    def reload_relayed(self, node_id: int, asked_at: dt.datetime) -> None:
        """The master relayed the reload asked at ``asked_at`` (a later ask stays)."""
        with self.engine.begin() as conn:
            conn.execute(
                update(Node)
                .where(Node.id == node_id, Node.reload_asked_at == asked_at)
                .values(reload_asked_at=None)
            )


def _payload_json(key: Any, payload: Any) -> str:
    """A job's payload as JSON text of an object; :class:`BadPayload` naming the job."""
    if isinstance(payload, Mapping):
        return json.dumps(dict(payload))
    if isinstance(payload, str):
        try:
            value = json.loads(payload)
        except ValueError:
            raise BadPayload(f"payload of job {key!r} is not JSON: {payload[:80]!r}") from None
        if isinstance(value, dict):
            return payload
        payload = value
    raise BadPayload(
        f"payload of job {key!r} must be a JSON object (a dict), not {type(payload).__name__}"
    )


def _encode(jobs: Iterable[tuple[str, Any]]) -> list[tuple[str, str]]:
    """(key, payload JSON) per job (see :func:`_payload_json`). A payload text is parsed
    once however many jobs carry it (``jodl jobs add --count`` gives all the same one)."""
    objects: set[str] = set()  # payload texts already found to be JSON objects
    encoded = []
    for key, payload in jobs:
        if payload.__class__ is dict:
            payload = json.dumps(payload)
        elif payload.__class__ is not str or payload not in objects:
            text = _payload_json(key, payload)
            if text is payload:
                objects.add(text)
            payload = text
        encoded.append((key, payload))
    return encoded


#: Keys read (and rows inserted) per statement where COPY is not at hand.
ADD_BATCH = 5000
#: The temporary table new jobs are copied into on PostgreSQL (emptied at commit).
ADD_STAGE = "_new_jodl_job"


def _add_new(
    conn: Connection, family_id: int, jobs: Sequence[tuple[str, str]], fields: Mapping[str, Any]
) -> int:
    """Add idle jobs (key, payload JSON) of ``family_id`` whose key it does not have yet,
    with ``fields`` (priority, every_n_cycles, min_interval); how many were added.

    On PostgreSQL the pairs stream into a temporary table by binary COPY, then one
    ``INSERT … SELECT`` adds them. To a family with no jobs yet, keys all different, a
    plain insert: ``ON CONFLICT DO NOTHING`` checks each row before inserting it, a
    third more of the server's time for 200,000 jobs (another transaction adding the
    same keys meanwhile makes the plain insert fail: it is undone to its savepoint
    and the checked one runs).
    Otherwise ``ON CONFLICT (family_id, key) DO NOTHING`` keeps the jobs the family
    has and adds a key given twice once. 200,000 jobs went in at about 9,000 jobs/s
    by reading the keys present and inserting rows with parameters, many times slower
    than this (``add_jobs_per_s`` in ``bench/throughput.py``). Elsewhere the keys
    present are read and the others inserted in batches.
    """
    now = utcnow()
    constants = {"family_id": family_id, "state": JobState.IDLE, "attempts": 0, "failures": 0,
                 "created_at": now, "updated_at": now, **fields}  # fmt: skip
    # No foreign key checks each row (migration jodl_0013): the family row, share-locked
    # until the commit, cannot be removed meanwhile, and one that is gone is refused.
    family = select(FamilyRow.id).where(FamilyRow.id == family_id)
    if conn.dialect.name == "postgresql":
        family = family.with_for_update(read=True)
    if conn.scalar(family) is None:
        raise UnknownFamily(f"family id {family_id} is not in the database (removed?)")
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql(
            f"CREATE TEMP TABLE IF NOT EXISTS {ADD_STAGE} "
            "(key varchar(2048), payload text) ON COMMIT DELETE ROWS"
        )
        bulk.copy_rows(conn, table_of(Job), ("key", "payload"), jobs, into=ADD_STAGE)
        # Through SQLAlchemy: a master's fenced engine proves its epoch before it writes.
        add = text(
            f"INSERT INTO {Job.__tablename__} (key, payload, {', '.join(constants)}) "
            f"SELECT key, payload, {', '.join(':' + c for c in constants)} FROM {ADD_STAGE}"
        )
        fresh = conn.scalar(select(Job.id).where(Job.family_id == family_id).limit(1)) is None
        if fresh and len({key for key, _ in jobs}) == len(jobs):
            try:
                with conn.begin_nested():
                    return int(conn.execute(add, constants).rowcount)
            except IntegrityError:
                pass
        checked = text(f"{add.text} ON CONFLICT (family_id, key) DO NOTHING")
        return int(conn.execute(checked, constants).rowcount)
    have: set[str] = set()
    keys = [k for k, _ in jobs]
    for start in range(0, len(keys), ADD_BATCH):
        have.update(
            conn.scalars(
                select(Job.key).where(
                    Job.family_id == family_id, Job.key.in_(keys[start : start + ADD_BATCH])
                )
            )
        )
    rows = []
    for key, payload in jobs:
        if key not in have:
            have.add(key)
            rows.append({"key": key, "payload": payload, **constants})
    for start in range(0, len(rows), ADD_BATCH):
        conn.execute(insert(Job), rows[start : start + ADD_BATCH])
    return len(rows)


class Families:
    """Reads and writes of families and of their jobs' definitions."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)

    def ensure_family(self, name: str, **fields: Any) -> FamilyRow:
        with self.sessions() as s, s.begin():
            fam = s.scalar(select(FamilyRow).where(FamilyRow.name == name))
            if fam is None:
                fam = FamilyRow(name=name, **fields)
                s.add(fam)
                s.flush()
            return fam

    def family(self, name: str) -> FamilyRow | None:
        with self.sessions() as s:
            return s.scalar(select(FamilyRow).where(FamilyRow.name == name))

    def family_rules(self, family_id: int) -> dict[int, FamilyOnNode]:
        with self.sessions() as s:
            rows = s.scalars(select(FamilyOnNode).where(FamilyOnNode.family_id == family_id))
            return {r.node_id: r for r in rows}

    def add_jobs(
        self,
        family: FamilyRow | str,
        jobs: Iterable[tuple[str, Any]] | Mapping[str, Any],
        priority: int | None = None,
        create: bool = False,
    ) -> int:
        """Add jobs to a family; the number added.

        ``family`` is a row, or a name: of a family in the database, else
        :class:`UnknownFamily` unless ``create`` (then it is created).
        ``jobs`` maps each job's key to its payload, as a mapping or (key, payload)
        pairs; a payload is a dict (encoded to JSON here) or the JSON text of an
        object: anything else is refused (:class:`BadPayload` naming the key) before
        anything is written. One transaction: all are added or none; keys the
        family already has are kept. New jobs take the family's job defaults
        (``jodl family set``) where set.
        """
        pairs = jobs.items() if isinstance(jobs, Mapping) else jobs
        encoded = _encode(pairs)
        if isinstance(family, str):
            found = self.family(family) if not create else self.ensure_family(family)
            if found is None:
                raise UnknownFamily(
                    f"no family {family!r} in the database: create it with "
                    "add_jobs(..., create=True) or add its jobs with `jodl jobs add`"
                )
            family = found
        defaults = (family.settings or {}).get("job_defaults") or {}
        fields = {
            "priority": defaults.get("priority", 0) if priority is None else priority,
            "every_n_cycles": defaults.get("every_n_cycles", 1),
            "min_interval": defaults.get("min_interval"),
        }
        if not encoded:
            return 0
        with self.engine.begin() as conn:
            return _add_new(conn, family.id, encoded, fields)

    def set_payloads(self, rows: Sequence[Mapping[str, Any]], conn: Connection) -> None:
        """New payloads and priorities of jobs: rows of ``id``, ``payload``, ``priority``."""
        table = table_of(Job)
        statement = (
            update(table)
            .where(table.c.id == bindparam("jid"))
            .values(payload=bindparam("new_payload"), priority=bindparam("new_priority"))
        )
        params = [
            {"jid": r["id"], "new_payload": r["payload"], "new_priority": r["priority"]}
            for r in rows
        ]
        for start in range(0, len(params), 5000):
            conn.execute(statement, params[start : start + 5000])
