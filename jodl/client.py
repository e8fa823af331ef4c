"""Jobs in and results out from Python, in a few calls (the README shows them).

    import jodl

    jodl.add_jobs("resize", {"photo-1": {"w": 2, "h": 3}})   # then `jodl run resize`
    for job in jodl.results("resize"):
        print(job.key, job.state, job.result or job.error)

Each call opens the database named by ``database_url`` (default: the
``JODL_DATABASE_URL`` setting, as the ``jodl`` command uses) and closes it again;
a program making many calls keeps one :class:`~jodl.log.store.Store` from
:func:`connect` instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .config import Settings
from .log.engine import ensure_schema, make_engine
from .log.records import RunResults
from .log.store import Store


def connect(database_url: str | None = None) -> Store:
    """The reconstruction log at ``database_url``, created or migrated to the newest schema."""
    url = database_url or Settings.from_env().database_url
    engine = make_engine(url)
    ensure_schema(engine)
    return Store(engine)


def add_jobs(
    family: str,
    jobs: Mapping[str, Any] | Iterable[tuple[str, Any]],
    database_url: str | None = None,
    priority: int | None = None,
) -> int:
    """Add jobs (key -> payload dict) to ``family``, all or none; the number added.

    ``priority`` None: the family's (``jodl family set --priority``), else 0.

    Keys the family already has are kept as they are. The next cycle
    (``jodl run FAMILY``, or a serving master) runs them.
    """
    store = connect(database_url)
    try:
        return store.add_jobs(family, jobs, priority=priority)
    finally:
        store.engine.dispose()


def results(family: str, run: int | None = None, database_url: str | None = None) -> RunResults:
    """Per job of run number ``run`` of ``family`` (default: its newest run): key, state,
    result (decoded JSON) or error. Iterate it; ``.run`` and ``.state`` describe the run."""
    store = connect(database_url)
    try:
        return store.results(family, run)
    finally:
        store.engine.dispose()
