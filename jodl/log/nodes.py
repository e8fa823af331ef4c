"""Nodes (agents the master calls) and families, with the rules joining them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, select, update
from sqlalchemy.orm import Session, sessionmaker

from ..exceptions import UnknownFamily
from .models import FamilyOnNode, FamilyRow, Job, Node, NodeState, table_of, utcnow
from .new_jobs import LinesAdded, LinesRefused, add_lines, add_new

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


def _job_fields(family: FamilyRow, priority: int | None) -> dict[str, Any]:
    """The fields of a new job of ``family``: its job defaults (``jodl family set``),
    ``priority`` unless None."""
    defaults = (family.settings or {}).get("job_defaults") or {}
    return {
        "priority": defaults.get("priority", 0) if priority is None else priority,
        "every_n_cycles": defaults.get("every_n_cycles", 1),
        "min_interval": defaults.get("min_interval"),
    }


def _ensure_family(s: Session, name: str, fields: Mapping[str, Any]) -> FamilyRow:
    """Family ``name`` in session ``s``, created with ``fields`` if it is new."""
    fam = s.scalar(select(FamilyRow).where(FamilyRow.name == name))
    if fam is None:
        fam = FamilyRow(name=name, **fields)
        s.add(fam)
        s.flush()
    return fam


class Families:
    """Reads and writes of families and of their jobs' definitions."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)

    def ensure_family(self, name: str, **fields: Any) -> FamilyRow:
        with self.sessions() as s, s.begin():
            return _ensure_family(s, name, fields)

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
        object: anything else is refused (:class:`BadPayload` naming the key) and
        nothing is written, not even a family ``create`` would have made. One
        transaction: all are added or none; keys the family already has are kept.
        New jobs take the family's job defaults (``jodl family set``) where set.
        """
        pairs = jobs.items() if isinstance(jobs, Mapping) else jobs
        with self.sessions() as s, s.begin():
            if isinstance(family, str):
                found = (
                    _ensure_family(s, family, {})
                    if create
                    else s.scalar(select(FamilyRow).where(FamilyRow.name == family))
                )
                if found is None:
                    raise UnknownFamily(
                        f"no family {family!r} in the database: create it with "
                        "add_jobs(..., create=True) or add its jobs with `jodl jobs add`"
                    )
                family = found
            return add_new(s.connection(), family.id, pairs, _job_fields(family, priority))

    def add_job_lines(self, name: str, lines: bytes, **fields: Any) -> LinesAdded | None:
        """Add the jobs of JSON Lines text (UTF-8, one ``{"key": ..., "payload": {...}}``
        a line; blank lines skipped) to family ``name``, created with ``fields`` if it is
        new, in one transaction, the lines parsed by PostgreSQL (:func:`add_lines`): keys
        the family has are kept. None where that is not done, nothing written (not even
        the family): not on PostgreSQL, or some line is not such a job, a key is on two
        lines, or no line holds a job; the caller then reads the lines in Python.
        """
        if self.engine.dialect.name != "postgresql":
            return None
        try:
            with self.sessions() as s, s.begin():
                family = _ensure_family(s, name, fields)
                return add_lines(s.connection(), family.id, lines, _job_fields(family, None))
        except LinesRefused:
            return None

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
