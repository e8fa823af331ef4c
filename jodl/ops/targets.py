"""Where Prometheus finds every live process's ``/metrics``: its HTTP service discovery.

The answer is the ``http_sd_configs`` format (a JSON list of target groups), one group
per live process: each master whose heartbeat has not expired and that serves an ops
endpoint (the address in its heartbeat row), each node an agent serves and a master
reached (the address its agent told in ``init``, :data:`jodl.log.nodes.OPS_LABEL`).
The web app serves it to operators (``/api/admin/prometheus/targets``,
docs/operations.md, "Finding every endpoint").
"""

from __future__ import annotations

from typing import Any

from ..log.models import NodeState
from ..log.nodes import OPS_LABEL
from ..log.store import Store

#: The ``job`` label of each kind of target (Prometheus keeps the scrape config's own
#: job name in ``job`` unless relabelled; these say which kind of process answers).
MASTER_JOB = "jodl-master"
AGENT_JOB = "jodl-agent"
#: Node states whose agent runs and is worth scraping (a suspect one may answer again).
LIVE_NODES = (NodeState.ACTIVE, NodeState.DRAINING, NodeState.SUSPECT)


def scrape_targets(store: Store) -> list[dict[str, Any]]:
    """Every live master's and agent's metrics address, as Prometheus HTTP SD target groups."""
    out: list[dict[str, Any]] = []
    for m in store.masters.masters():
        if m.live and m.ops:
            out.append(_group(m.ops, MASTER_JOB, m.name))
    for node in store.nodes():
        ops = (node.labels or {}).get(OPS_LABEL)
        if node.state in LIVE_NODES and isinstance(ops, str) and ops:
            out.append(_group(ops, AGENT_JOB, node.address))
    return out


def _group(address: str, job: str, node: str) -> dict[str, Any]:
    return {"targets": [address], "labels": {"job": job, "jodl_node": node}}


__all__ = ["AGENT_JOB", "MASTER_JOB", "scrape_targets"]
