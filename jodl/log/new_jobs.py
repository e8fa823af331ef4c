"""New jobs of a family: from (key, payload) pairs, or from JSON Lines text that
PostgreSQL reads itself (``jodl jobs add --from``).

Both add only the keys the family does not have yet, in the caller's transaction.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection, insert, select, text
from sqlalchemy.exc import DataError, IntegrityError

from ..exceptions import BadPayload, UnknownFamily
from . import bulk, fence
from .models import FamilyRow, Job, JobState, table_of, utcnow


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


def encoded(jobs: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, str]]:
    """(key, payload JSON) per job, as they are drawn (see :func:`_payload_json`). A
    payload text is parsed once however many jobs carry it (``jodl jobs add --count``
    gives all the same one)."""
    objects: set[str] = set()  # payload texts already found to be JSON objects
    for key, payload in jobs:
        if payload.__class__ is dict:
            payload = json.dumps(payload)
        elif payload.__class__ is not str or payload not in objects:
            text = _payload_json(key, payload)
            if text is payload:
                objects.add(text)
            payload = text
        yield key, payload


#: Keys read (and rows inserted) per statement where COPY is not at hand.
ADD_BATCH = 5000
#: The temporary table new jobs are copied into on PostgreSQL (emptied at commit).
ADD_STAGE = "_new_jodl_job"


def _constants(family_id: int, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The columns every new job of ``family_id`` starts with (``fields``: priority,
    every_n_cycles, min_interval)."""
    now = utcnow()
    return {"family_id": family_id, "state": JobState.IDLE, "attempts": 0, "failures": 0,
            "created_at": now, "updated_at": now, **fields}  # fmt: skip


def _hold_family(conn: Connection, family_id: int) -> None:
    """Refuse a family that is gone; on PostgreSQL share-lock its row until the commit.

    No foreign key checks each new job (migration jodl_0013): the family row, locked,
    cannot be removed meanwhile."""
    family = select(FamilyRow.id).where(FamilyRow.id == family_id)
    if conn.dialect.name == "postgresql":
        family = family.with_for_update(read=True)
    if conn.scalar(family) is None:
        raise UnknownFamily(f"family id {family_id} is not in the database (removed?)")


def _has_jobs(conn: Connection, family_id: int) -> bool:
    return conn.scalar(select(Job.id).where(Job.family_id == family_id).limit(1)) is not None


def _insert_from(source: str, constants: Mapping[str, Any]) -> str:
    """``INSERT INTO jodl_job`` of the ``key`` and ``payload`` that ``source`` (a table
    or a parenthesised query) selects, each with ``constants`` as bind parameters."""
    return (
        f"INSERT INTO {Job.__tablename__} (key, payload, {', '.join(constants)}) "
        f"SELECT key, payload, {', '.join(':' + c for c in constants)} FROM {source} AS given"
    )


def add_new(
    conn: Connection, family_id: int, jobs: Iterable[tuple[str, Any]], fields: Mapping[str, Any]
) -> int:
    """Add idle jobs (key, payload: see :func:`encoded`) of ``family_id`` whose key it
    does not have yet, with ``fields`` (priority, every_n_cycles, min_interval); how
    many were added. A bad payload raises :class:`BadPayload`: the caller's
    transaction must then be rolled back.

    On PostgreSQL, to a family with no jobs yet, the jobs are copied straight into
    ``jodl_job`` (binary COPY), each encoded as it is sent: the server inserts the first
    rows while Python encodes the last, and COPY stores rows a page at a time. 100,000
    jobs went in 1.3 times as fast as through a temporary table and ``INSERT …
    SELECT`` (about 260,000 jobs/s against 200,000, ``add_jobs_per_s`` in
    ``bench/throughput.py``); the server's inserts are most of what is left. A key
    given twice, or one another transaction adds meanwhile, fails the copy: it is
    undone to its savepoint and the jobs go the checked way.
    The checked way (a family with jobs): the pairs are copied into a temporary table,
    then one ``INSERT … SELECT … ON CONFLICT (family_id, key) DO NOTHING`` keeps the
    jobs the family has and adds a key given twice once. Elsewhere the keys present are
    read and the others inserted in batches.
    """
    constants = _constants(family_id, fields)
    _hold_family(conn, family_id)
    source = encoded(jobs)
    if conn.dialect.name != "postgresql":
        return _add_read_first(conn, family_id, list(source), constants)
    from psycopg.errors import UniqueViolation  # raised by COPY, below SQLAlchemy

    given: list[tuple[str, str]] = []
    if not _has_jobs(conn, family_id):
        tail = tuple(constants.values())

        def rows() -> Iterator[tuple[Any, ...]]:
            for pair in source:
                given.append(pair)
                yield pair + tail

        fence.prove(conn)  # the COPY below passes no SQLAlchemy hook
        try:
            with conn.begin_nested():
                bulk.copy_rows(conn, table_of(Job), ("key", "payload", *constants), rows())
                return len(given)
        except UniqueViolation:
            pass
    given.extend(source)
    conn.exec_driver_sql(
        f"CREATE TEMP TABLE IF NOT EXISTS {ADD_STAGE} "
        "(key varchar(2048), payload text) ON COMMIT DELETE ROWS"
    )
    bulk.copy_rows(conn, table_of(Job), ("key", "payload"), given, into=ADD_STAGE)
    # Through SQLAlchemy: a master's fenced engine proves its epoch before it writes.
    checked = f"{_insert_from(ADD_STAGE, constants)} ON CONFLICT (family_id, key) DO NOTHING"
    return int(conn.execute(text(checked), constants).rowcount)


def _add_read_first(
    conn: Connection,
    family_id: int,
    jobs: Sequence[tuple[str, str]],
    constants: Mapping[str, Any],
) -> int:
    """:func:`add_new` without COPY: the keys present read, the others inserted."""
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


# -- JSON Lines, read by PostgreSQL ---------------------------------------------------------

#: The temporary table JSON Lines text is copied into, one line a row (emptied at commit).
LINES_STAGE = "_jodl_job_line"
#: The temporary table the jobs of those lines go through when the family has jobs
#: already: its primary key refuses a key given on two lines (emptied at commit).
LINES_JOBS = "_jodl_job_line_job"

# Each line's job. The key: a JSON string, not empty; the payload: a JSON object, kept
# as the line wrote it (absent: {}). Anything else gives NULL, which the NOT NULL
# columns refuse; a line that is not JSON fails its cast. Empty lines are skipped; a
# line of whitespace fails too, and is then read in Python (which skips it).
# Each ``->`` of a json value parses all of it: the key and the payload are taken
# once each (OFFSET 0 keeps the planner from pasting ``j -> 'key'`` into the four
# places that read it), three parses a line where the plain form made five, a third
# of the statement's time.
LINE_JOBS = f"""(
    SELECT CASE WHEN json_typeof(k) = 'string' THEN NULLIF(k #>> '{{}}', '') END AS key,
           CASE coalesce(json_typeof(p), 'absent')
               WHEN 'object' THEN p::text WHEN 'absent' THEN '{{}}' END AS payload
    FROM (SELECT j -> 'key' AS k, j -> 'payload' AS p
          FROM (SELECT line::json AS j FROM {LINES_STAGE} WHERE line <> '' OFFSET 0) AS parsed
          OFFSET 0) AS fields
)"""


class LinesAdded(NamedTuple):
    """What :func:`add_lines` did: jobs ``added``, of the ``given`` lines' jobs (the
    others' keys the family had)."""

    added: int
    given: int


class LinesRefused(Exception):
    """Some line is not a well-formed job, a key is on two lines, or no line holds a
    job: the caller's transaction must be rolled back, and the lines read in Python to
    say which are bad."""


def _stage_lines(conn: Connection, lines: bytes) -> None:
    """Each line of ``lines`` a row of :data:`LINES_STAGE` in ``conn``'s transaction."""
    conn.exec_driver_sql(
        f"CREATE TEMP TABLE IF NOT EXISTS {LINES_STAGE} (line text) ON COMMIT DELETE ROWS"
    )
    bulk.copy_lines(conn, LINES_STAGE, "line", lines)


def add_lines(
    conn: Connection, family_id: int, lines: bytes, fields: Mapping[str, Any]
) -> LinesAdded:
    """Add the jobs of JSON Lines ``lines`` (UTF-8, one ``{"key": ..., "payload":
    {...}}`` a line) to ``family_id`` (PostgreSQL only), the keys it has kept; or
    :class:`LinesRefused`, leaving the transaction to be rolled back.

    The lines go to the server as they are, in one COPY, and the server parses them:
    no line is parsed or encoded in Python. Reading each line in Python
    (``json.loads``, then ``json.dumps`` of its payload) took twice as long as the rest,
    about 85,000 jobs/s (``cli_add_jobs_per_s`` in ``bench/throughput.py``). The
    server only says a line is bad, not which one: the caller reads them itself after
    a refusal, the rare case.

    To a family with no jobs, the lines are parsed on a second connection and the jobs
    piped, as the parse makes them, into this one's binary COPY into ``jodl_job``
    (:func:`~jodl.log.bulk.pipe_rows`): the parse and the inserts run in two server
    processes at once, the table's unique key refusing a key given twice. 300,000
    lines went in at 183,000-189,000 jobs/s parsed and inserted by one ``INSERT …
    SELECT`` in this connection, at 222,000-247,000 piped (the inserts are the larger
    half); at 100,000 lines the gain is within the noise of ``cli_add_jobs_per_s``.
    To a family with jobs, through :data:`LINES_JOBS` (whose primary key refuses a key
    given twice), then with ``ON CONFLICT DO NOTHING``.
    """
    from psycopg import DataError as BadCopy  # raised by COPY, below SQLAlchemy
    from psycopg import IntegrityError as BadCopiedRow

    constants = _constants(family_id, fields)
    _hold_family(conn, family_id)
    try:
        if not _has_jobs(conn, family_id):
            fence.prove(conn)  # the COPY below passes no SQLAlchemy hook
            with conn.engine.connect() as reader:  # parses while this connection stores
                _stage_lines(reader, lines)
                cols = ("key", "payload")
                given = bulk.pipe_rows(reader, LINE_JOBS, conn, table_of(Job), cols, constants)
            added = given
        else:
            _stage_lines(conn, lines)
            conn.exec_driver_sql(
                f"CREATE TEMP TABLE IF NOT EXISTS {LINES_JOBS} "
                "(key varchar(2048) PRIMARY KEY, payload text NOT NULL) ON COMMIT DELETE ROWS"
            )
            staged = f"INSERT INTO {LINES_JOBS} SELECT * FROM {LINE_JOBS} AS j"
            given = int(conn.exec_driver_sql(staged).rowcount)
            kept = " ON CONFLICT (family_id, key) DO NOTHING"
            added = int(
                conn.execute(text(_insert_from(LINES_JOBS, constants) + kept), constants).rowcount
            )
    except (DataError, IntegrityError, BadCopy, BadCopiedRow) as exc:
        raise LinesRefused(str(exc).splitlines()[0]) from exc
    if not given:
        raise LinesRefused("no line holds a job")
    return LinesAdded(added, given)


__all__ = [
    "ADD_BATCH",
    "ADD_STAGE",
    "LINES_JOBS",
    "LINES_STAGE",
    "LinesAdded",
    "LinesRefused",
    "add_lines",
    "add_new",
    "encoded",
]
