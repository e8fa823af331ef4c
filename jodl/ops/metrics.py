"""The Prometheus metrics of JODL's processes, for applications (a public module).

The declarations are in :mod:`jodl.obs.metrics` (imported by every layer); the
collectors that read state to report it live beside that state. This module gathers
what applications use, such as the web UI's ``/metrics``.
"""

from __future__ import annotations

from ..agent.collector import AgentCollector, register_agent
from ..obs.metrics import count_outcomes, count_sent
from ..queue.collector import DatabaseCollector, register_database

__all__ = [
    "AgentCollector",
    "DatabaseCollector",
    "count_outcomes",
    "count_sent",
    "register_agent",
    "register_database",
]
