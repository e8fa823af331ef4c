"""Families' settings, node rules and job listings, for ``jodl family`` and the apps.

The checks and the shapes shown to people live in :mod:`jodl.admin.families`;
this gateway holds its statements, one transaction per method.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, delete, func, select, update
from sqlalchemy.orm import Session, sessionmaker

from ..exceptions import JodlError, UnknownFamily
from .models import (
    Execution,
    FamilyBudget,
    FamilyOnNode,
    FamilyRow,
    Job,
    JobOnNode,
    JobState,
    Node,
    Run,
    RunRequest,
    RunState,
)


@dataclass(slots=True)
class FamilyFacts:
    """A family as stored: its row, how many jobs it has, what its jobs share, its rules."""

    family: FamilyRow
    #: Its jobs but the deleted ones.
    jobs: int
    #: Per job field asked for: up to two distinct values among the family's jobs.
    job_values: dict[str, list[Any]]
    #: (node address, rule) of the nodes with a rule for the family, by address.
    rules: list[tuple[str, FamilyOnNode]]


class FamilyAdminLog:
    """Statements of the family administration (see :class:`jodl.admin.families.FamilyAdmin`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)

    def facts(self, name: str, job_fields: Sequence[str]) -> FamilyFacts:
        """One family; :class:`UnknownFamily` naming the known ones if there is none."""
        with self.sessions() as s:
            return self._facts(s, _family(s, name), job_fields)

    def all_facts(self, job_fields: Sequence[str]) -> list[FamilyFacts]:
        """Every family, by name."""
        with self.sessions() as s:
            return [
                self._facts(s, f, job_fields)
                for f in s.scalars(select(FamilyRow).order_by(FamilyRow.name))
            ]

    def schedules(self) -> dict[str, str]:
        """Family name -> cron line, for the families that have a schedule."""
        with self.sessions() as s:
            rows = s.execute(
                select(FamilyRow.name, FamilyRow.schedule).where(FamilyRow.schedule.is_not(None))
            ).all()
        return {name: cron for name, cron in rows if cron}

    def update(
        self,
        name: str,
        family_values: Mapping[str, Any],
        job_values: Mapping[str, Any],
        check: Callable[[FamilyRow], None],
        job_fields: Sequence[str],
    ) -> FamilyFacts:
        """Set fields of the family row and of all its jobs in one transaction.

        ``check`` sees the family with its new values before the commit and raises
        to refuse them (nothing is written then). Job values also become the
        family's defaults for jobs added later (:meth:`Families.add_jobs`).
        """
        with self.sessions() as s, s.begin():
            family = _family(s, name)
            for key, value in family_values.items():
                setattr(family, key, value)
            check(family)
            if job_values:
                s.execute(update(Job).where(Job.family_id == family.id).values(**job_values))
                settings = dict(family.settings or {})
                settings["job_defaults"] = {**settings.get("job_defaults", {}), **job_values}
                family.settings = settings
            s.flush()
            return self._facts(s, family, job_fields)

    def node_ids(self, addresses: Sequence[str]) -> dict[str, int]:
        """address -> node id, for the known ones of these addresses."""
        with self.sessions() as s:
            return dict(
                s.execute(select(Node.address, Node.id).where(Node.address.in_(list(addresses))))
                .tuples()
                .all()
            )

    def set_rules(
        self,
        name: str,
        node_ids: Sequence[int],
        allowed: bool,
        max_slots: int | None,
        conditions: dict[str, Any],
        job_fields: Sequence[str],
    ) -> FamilyFacts:
        """Replace the family's rule on these nodes by one rule, in one transaction."""
        with self.sessions() as s, s.begin():
            family = _family(s, name)
            s.execute(
                delete(FamilyOnNode).where(
                    FamilyOnNode.family_id == family.id,
                    FamilyOnNode.node_id.in_(list(node_ids)),
                )
            )
            for node_id in node_ids:
                s.add(
                    FamilyOnNode(
                        family_id=family.id,
                        node_id=node_id,
                        allowed=allowed,
                        max_slots=max_slots,
                        conditions=conditions,
                    )
                )
            s.flush()
            return self._facts(s, family, job_fields)

    def remove(self, name: str) -> int:
        """Remove a family with no jobs left (but deleted ones) and no running run: its
        row, runs, executions, what was learned of its jobs, node rules and requests,
        in one transaction; how many deleted jobs went with it. :class:`FamilyInUse`
        (nothing removed) otherwise."""
        with self.sessions() as s, s.begin():
            family = _family(s, name)
            facts = self._facts(s, family, ())
            if facts.jobs:
                raise FamilyInUse(
                    f"family {name!r} has {facts.jobs} jobs: delete them first "
                    f"(`jodl jobs delete {name} KEY...`)"
                )
            running = s.scalar(
                select(Run.number).where(Run.family_id == family.id, Run.state == RunState.RUNNING)
            )
            if running is not None:
                raise FamilyInUse(
                    f"run {name}#{running} is running: cancel it first (`jodl run cancel {name}`)"
                )
            jobs = select(Job.id).where(Job.family_id == family.id).scalar_subquery()
            gone = s.scalar(select(func.count()).where(Job.family_id == family.id)) or 0
            s.execute(delete(JobOnNode).where(JobOnNode.job_id.in_(jobs)))
            s.execute(delete(Execution).where(Execution.job_id.in_(jobs)))
            s.execute(delete(RunRequest).where(RunRequest.family == name))
            s.execute(delete(Job).where(Job.family_id == family.id))
            s.execute(delete(Run).where(Run.family_id == family.id))  # dispatches cascade
            s.execute(delete(FamilyOnNode).where(FamilyOnNode.family_id == family.id))
            s.execute(delete(FamilyBudget).where(FamilyBudget.family_id == family.id))
            s.delete(family)
            return int(gone)

    def jobs(self, name: str, state: str | None, limit: int) -> list[Job]:
        """Jobs of the family (in one state if given), oldest first, at most ``limit``."""
        with self.sessions() as s:
            family = _family(s, name)
            q = select(Job).where(Job.family_id == family.id).order_by(Job.id).limit(limit)
            if state is not None:
                q = q.where(Job.state == state)
            return list(s.scalars(q))

    @staticmethod
    def _facts(s: Session, family: FamilyRow, job_fields: Sequence[str]) -> FamilyFacts:
        live = (Job.family_id == family.id, Job.state != JobState.DELETED)
        jobs = s.scalar(select(func.count()).where(*live)) or 0
        values = {
            name: list(s.scalars(select(getattr(Job, name)).where(*live).distinct().limit(2)))
            for name in job_fields
        }
        rules = [
            (address, rule)
            for address, rule in s.execute(
                select(Node.address, FamilyOnNode)
                .join(FamilyOnNode, FamilyOnNode.node_id == Node.id)
                .where(FamilyOnNode.family_id == family.id)
                .order_by(Node.address)
            ).tuples()
        ]
        return FamilyFacts(family=family, jobs=int(jobs), job_values=values, rules=rules)


class FamilyInUse(JodlError):
    """A family that still has jobs or a running run cannot be removed."""


def _family(s: Session, name: str) -> FamilyRow:
    family = s.scalar(select(FamilyRow).where(FamilyRow.name == name))
    if family is None:
        known = ", ".join(s.scalars(select(FamilyRow.name).order_by(FamilyRow.name))) or "none"
        raise UnknownFamily(f"no family {name!r} in the database (families: {known})")
    return family
