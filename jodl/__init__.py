"""JODL, the Job Dispatching Library.

A master runs *families* of jobs in *cycles* on many *agents* over rpyc, places
jobs with a pluggable strategy that learns how long each job takes on each node,
and writes every decision to a SQL reconstruction log so that a master killed at
any moment resumes its cycle without redoing finished jobs.

The public names load on first use (:func:`__getattr__`): ``import jodl`` and the
``jodl`` command start without the database and network layers.

Public API (docs/architecture.md#parts-and-layering): the names in the ``__all__`` of each
module of :data:`PUBLIC_MODULES` — this package, the packages ``jodl.log``,
``jodl.agent``, ``jodl.master``, ``jodl.queue`` and ``jodl.placement``, and the few
modules for settings, errors, migrations, metrics and command plug-ins. Everything
else (``jodl.log.models``, ``jodl.agent.wire`` ...) is internal and may change;
applications (the page checker, the web UI) import public names only
(tests/test_layering.py).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .admin.requests import RunRequests as RunRequests
    from .client import add_jobs as add_jobs
    from .client import connect as connect
    from .client import results as results
    from .exceptions import JodlError as JodlError
    from .family import Family as Family
    from .family import Permanent as Permanent
    from .family import cancelled as cancelled
    from .family import progress as progress
    from .family import wait_cancelled as wait_cancelled
    from .log.engine import make_engine as make_engine
    from .log.records import JobResult as JobResult
    from .log.records import RunResults as RunResults
    from .log.store import Store as Store
    from .master import Master as Master
    from .master import RunSummary as RunSummary
    from .ops.status import collect as collect_status
    from .ops.targets import scrape_targets as scrape_targets
    from .placement import Knowledge as Knowledge
    from .placement import NodeLoad as NodeLoad
    from .placement import Placement as Placement
    from .placement import register as register_strategy
    from .queue import Queue as Queue
    from .queue import QueueFeeder as QueueFeeder
    from .settings.config import Settings as Settings

#: Public name -> (module of the package, name there).
_PUBLIC = {
    "add_jobs": ("client", "add_jobs"),
    "connect": ("client", "connect"),
    "results": ("client", "results"),
    "Settings": ("settings.config", "Settings"),
    "JodlError": ("exceptions", "JodlError"),
    "Family": ("family", "Family"),
    "Permanent": ("family", "Permanent"),
    "cancelled": ("family", "cancelled"),
    "wait_cancelled": ("family", "wait_cancelled"),
    "progress": ("family", "progress"),
    "Master": ("master", "Master"),
    "RunSummary": ("master", "RunSummary"),
    "Knowledge": ("placement", "Knowledge"),
    "NodeLoad": ("placement", "NodeLoad"),
    "Placement": ("placement", "Placement"),
    "register_strategy": ("placement", "register"),
    "Queue": ("queue", "Queue"),
    "QueueFeeder": ("queue", "QueueFeeder"),
    "JobResult": ("log.records", "JobResult"),
    "RunResults": ("log.records", "RunResults"),
    "Store": ("log.store", "Store"),
    "make_engine": ("log.engine", "make_engine"),
    "RunRequests": ("admin.requests", "RunRequests"),
    "collect_status": ("ops.status", "collect"),
    "scrape_targets": ("ops.targets", "scrape_targets"),
}

#: The modules whose ``__all__`` is the public API; any other module of jodl is internal.
PUBLIC_MODULES = (
    "jodl",
    "jodl.agent",
    "jodl.cli.budget",  # command plug-ins: the budget parameter type
    "jodl.cli.context",  # command plug-ins: settings, store, logging
    "jodl.settings.config",  # settings
    "jodl.exceptions",
    "jodl.failpoint",  # named crash points for crash tests
    "jodl.admin.families",  # family administration shared by ``jodl family`` and the web
    "jodl.log",
    "jodl.master",
    "jodl.ops.metrics",  # Prometheus collectors
    "jodl.ops.server",  # the ops endpoint, for applications that run a master or agent
    "jodl.log.migrate",  # the migration chain, applications' branches included
    "jodl.settings.options",  # declaring settings
    "jodl.placement",
    "jodl.cli.progress",  # command plug-ins: progress reporting
    "jodl.queue",
)

__all__ = [
    "Family",
    "JobResult",
    "JodlError",
    "Knowledge",
    "Master",
    "NodeLoad",
    "PUBLIC_MODULES",
    "Permanent",
    "Placement",
    "Queue",
    "QueueFeeder",
    "RunRequests",
    "RunResults",
    "RunSummary",
    "Settings",
    "Store",
    "add_jobs",
    "cancelled",
    "collect_status",
    "connect",
    "make_engine",
    "progress",
    "register_strategy",
    "results",
    "scrape_targets",
    "wait_cancelled",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    try:
        module, attr = _PUBLIC[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(import_module(f".{module}", __name__), attr)
    globals()[name] = value  # later lookups skip this function
    return value
