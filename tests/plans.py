"""What PostgreSQL plans for a statement a test saw go by (``EXPLAIN``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

#: A statement as the driver got it: SQL text and its parameters.
Seen = tuple[str, Any]


def plan_nodes(engine: Engine, setting: Seen, statement: Seen) -> list[dict[str, Any]]:
    """Every node of ``statement``'s plan, in a transaction that ran ``setting`` first
    (rolled back after)."""
    with engine.begin() as conn:
        conn.exec_driver_sql(*setting)
        plan = conn.exec_driver_sql("EXPLAIN (FORMAT JSON) " + statement[0], statement[1])
        todo = [plan.scalar()[0]["Plan"]]
        conn.rollback()
    nodes = []
    while todo:
        nodes.append(todo.pop())
        todo.extend(nodes[-1].get("Plans", []))
    return nodes
