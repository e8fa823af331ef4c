"""What applications and operators read from the log, without knowing its tables.

Applications (``crawler_app``, ``web``) and ``jodl status`` read the library's
tables only through these methods, so the schema can change behind them.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import sessionmaker

from .models import Family, Job, Node, Run


class Reads:
    """Read-only views of the log for applications, the CLI and the web API."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)

    def overview(self, runs: int = 10) -> dict[str, Any]:
        """Nodes, families with job counts per state, and the ``runs`` newest runs."""
        with self.sessions() as s:
            nodes = [
                {
                    "id": n.id,
                    "address": n.address,
                    "state": n.state,
                    "slots": n.slots,
                    "speed": n.speed,
                    "last_seen": n.last_seen,
                    "last_error": n.last_error,
                }
                for n in s.scalars(select(Node).order_by(Node.id))
            ]
            counts: dict[int, dict[str, int]] = {}
            for fam_id, state, count in s.execute(
                select(Job.family_id, Job.state, func.count()).group_by(Job.family_id, Job.state)
            ):
                counts.setdefault(fam_id, {})[state] = count
            families = [
                {"id": f.id, "name": f.name, "strategy": f.strategy, "jobs": counts.get(f.id, {})}
                for f in s.scalars(select(Family).order_by(Family.name))
            ]
            names = {f["id"]: f["name"] for f in families}
            recent = [
                {
                    "id": r.id,
                    "family": names.get(r.family_id, "?"),
                    "number": r.number,
                    "state": r.state,
                    "started_at": r.started_at,
                    "finished_at": r.finished_at,
                    "jobs_total": r.jobs_total,
                    "jobs_done": r.jobs_done,
                    "jobs_failed": r.jobs_failed,
                    "jobs_dead": r.jobs_dead,
                    "makespan": r.makespan,
                    "lower_bound": r.lower_bound,
                    "ratio": r.ratio,
                }
                for r in s.scalars(select(Run).order_by(Run.id.desc()).limit(runs))
            ]
        return {"nodes": nodes, "families": families, "runs": recent}
