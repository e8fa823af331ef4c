"""Jobs in and results out from Python, in a few calls (the README shows them).

    import jodl

    jodl.add_jobs("resize", {"photo-1": {"w": 2, "h": 3}})   # then `jodl run resize`
    for job in jodl.results("resize"):
        print(job.key, job.state, job.result or job.error)

Each call opens the database named by ``database_url`` (default: the
``JODL_DATABASE_URL`` setting, as the ``jodl`` command uses) and closes it again;
a program making many calls keeps one :class:`~jodl.log.store.Store` from
:func:`connect` instead.

As strict as the ``jodl`` command: a family unknown both to the database and to
the installed entry points is refused unless created explicitly (``create=True``),
a payload must be a JSON object, and a read never creates a database.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .exceptions import ConfigError, UnknownFamily
from .family import check_payloads
from .log.engine import ensure_schema, make_engine, missing_sqlite_file
from .log.records import RunResults
from .log.store import Store
from .obs import tracing
from .settings.config import Settings


def connect(database_url: str | None = None, create: bool = True) -> Store:
    """The reconstruction log at ``database_url``, migrated to the newest schema.

    ``create`` False (reads): a SQLite file that does not exist is an error
    (:class:`~jodl.exceptions.ConfigError`) instead of a new, empty database.
    """
    url = database_url or Settings.from_env().database_url
    missing = None if create else missing_sqlite_file(url)
    if missing is not None:
        raise ConfigError(
            f"no database at {missing}: run `jodl db upgrade` or `jodl up` to create it "
            "(or pass database_url=, or set JODL_DATABASE_URL)"
        )
    engine = make_engine(url)
    ensure_schema(engine)
    return Store(engine)


def add_jobs(
    family: str,
    jobs: Mapping[str, Any] | Iterable[tuple[str, Any]],
    database_url: str | None = None,
    priority: int | None = None,
    create: bool = False,
    store: Store | None = None,
) -> int:
    """Add jobs (key -> payload, a dict) to ``family``, all or none; the number added.

    ``family`` is one in the database or installed here (an entry point of the
    group ``jodl.families``, as ``jodl jobs add`` requires); any other name is
    refused (:class:`~jodl.exceptions.UnknownFamily`) unless ``create`` is True, for
    a family only the agents have installed. A payload that is not a JSON object
    is refused (:class:`~jodl.exceptions.BadPayload`), as is one its family's
    ``payload_model`` refuses (naming the job's index and key), and nothing is added.

    ``priority`` None: the family's (``jodl family set --priority``), else 0.
    Keys the family already has are kept as they are. The next cycle
    (``jodl run FAMILY``, or a serving master) runs them. ``store``: an open
    :class:`~jodl.log.store.Store` to use instead of ``database_url`` (kept open).
    """
    rows = list(jobs.items() if isinstance(jobs, Mapping) else jobs)
    tracing.configure()  # JODL_TRACES, unless this process set traces up already
    check_payloads(family, rows, lambda n, key: f"jobs[{n}] (key {key!r})")
    own = store is None
    store = connect(database_url) if store is None else store
    try:
        if not create and store.family(family) is None:
            from .family import load

            try:
                load(family)
            except UnknownFamily as exc:
                raise UnknownFamily(f"{exc}; add_jobs(..., create=True) adds it anyway") from None
            create = True  # installed here: created as `jodl jobs add` would
        return store.add_jobs(family, rows, priority=priority, create=create)
    finally:
        if own:
            store.engine.dispose()


def results(family: str, run: int | None = None, database_url: str | None = None) -> RunResults:
    """Per job of run number ``run`` of ``family`` (default: its newest run): key, state,
    result (decoded JSON) or error. Iterate it; ``.run`` and ``.state`` describe the run.

    A SQLite file that does not exist is an error: a read creates no database."""
    store = connect(database_url, create=False)
    try:
        return store.results(family, run)
    finally:
        store.engine.dispose()
