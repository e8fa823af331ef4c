"""Batched writes: one statement for a whole batch of rows, whatever its size.

On PostgreSQL the rows travel as one array per column and ``unnest`` turns them
back into rows inside the server: one round trip and one plan for thousands of
rows, several times faster than pipelined executemany. On SQLite (in-process, no
round trips) plain executemany is already the fast path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import (
    Column,
    Connection,
    Engine,
    MetaData,
    Pool,
    Table,
    TextClause,
    bindparam,
    event,
    text,
)
from sqlalchemy.types import TypeEngine


def int_array(values: Iterable[int | None]) -> str:
    """Integers (None: NULL) as the text of a PostgreSQL array, for a parameter the
    statement casts to an integer array (``CAST(:ids AS BIGINT[])``).

    psycopg sends a list element by element in Python: 1.2 µs an element, round trip
    included, against 0.3 µs as this text (2,000 ids, one parameter). The values are
    the log's own ids and counts; an element that is not an integer fails the cast.
    """
    return "{" + ",".join(["NULL" if v is None else str(v) for v in values]) + "}"


def text_array(values: Iterable[str | None]) -> str:
    """Strings (None: NULL) as the text of a PostgreSQL array, for a parameter the
    statement casts to a text array (``CAST(:keys AS TEXT[])``): each element quoted,
    its backslashes and double quotes escaped, so any string reads back as it was.

    Two lists of 5,000 short strings cost psycopg 3.3 µs of CPU an element pair, these
    texts 0.3 (the enqueue's keys and payloads).
    """
    quoted = [
        "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        for v in values
    ]
    return "{" + ",".join(quoted) + "}"


def _unnest(conn: Connection, table: Table, cols: Sequence[str]) -> str:
    casts = ", ".join(
        f"CAST(:{c} AS {table.c[c].type.compile(dialect=conn.dialect)}[])" for c in cols
    )
    names = ", ".join(f'"{c}"' for c in cols)
    return f"unnest({casts}) AS v({names})"


def _arrays(rows: Sequence[Mapping[str, Any]], cols: Sequence[str]) -> dict[str, list[Any]]:
    return {c: [row[c] for row in rows] for c in cols}


def insert_rows(conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]) -> None:
    """Insert ``rows`` (dicts with the same keys) into ``table``."""
    if not rows:
        return
    if conn.dialect.name != "postgresql":
        conn.execute(table.insert(), list(rows))
        return
    cols = list(rows[0])
    names = ", ".join(f'"{c}"' for c in cols)
    conn.execute(
        text(f'INSERT INTO "{table.name}" ({names}) SELECT * FROM {_unnest(conn, table, cols)}'),
        _arrays(rows, cols),
    )


def update_rows(
    conn: Connection,
    table: Table,
    key: str,
    rows: Sequence[Mapping[str, Any]],
    constants: Mapping[str, Any] | None = None,
    only_if: Mapping[str, Any] | None = None,
) -> int:
    """Update rows matched by ``key``: each row's other keys are the new values.

    ``constants`` are set on every matched row; ``only_if`` (column -> value)
    restricts the update to rows still in that state (a guard). Returns the
    number of rows changed.
    """
    if not rows:
        return 0
    constants = dict(constants or {})
    only_if = dict(only_if or {})
    cols = list(rows[0])
    values = [c for c in cols if c != key]
    if conn.dialect.name != "postgresql":
        stmt = table.update().where(table.c[key] == bindparam("_k"))
        for col, value in only_if.items():
            stmt = stmt.where(table.c[col] == value)
        stmt = stmt.values({c: bindparam("_" + c) for c in values}, **constants)
        each = [{"_" + c: row[c] for c in cols} | {"_k": row[key]} for row in rows]
        return int(conn.execute(stmt, each).rowcount or 0)
    sets = [f'"{c}" = v."{c}"' for c in values]
    sets += [f'"{c}" = :const_{c}' for c in constants]
    where = [f't."{key}" = v."{key}"'] + [f't."{c}" = :if_{c}' for c in only_if]
    sql = (
        f'UPDATE "{table.name}" AS t SET {", ".join(sets)} '
        f"FROM {_unnest(conn, table, cols)} WHERE {' AND '.join(where)}"
    )
    params: dict[str, Any] = _arrays(rows, cols)
    params.update({f"const_{c}": v for c, v in constants.items()})
    params.update({f"if_{c}": v for c, v in only_if.items()})
    return int(conn.execute(text(sql), params).rowcount or 0)


def copy_rows(
    conn: Connection,
    table: Table,
    cols: Sequence[str],
    rows: Iterable[Sequence[Any]],
    into: str | None = None,
) -> None:
    """Append ``rows`` (tuples in ``cols`` order): COPY on PostgreSQL, executemany elsewhere.

    ``into`` names another table of the same columns (e.g. a temporary one). ``rows``
    may be an iterator: on PostgreSQL each row is sent as it is drawn, so the server
    stores the first rows while the caller still makes the last.
    """
    if isinstance(rows, Sequence) and not rows:
        return
    if conn.dialect.name != "postgresql":
        target_table = _stage_table(table) if into else table
        conn.execute(target_table.insert(), [dict(zip(cols, row, strict=True)) for row in rows])
        return
    raw = conn.connection.driver_connection
    assert raw is not None
    names = ", ".join(f'"{c}"' for c in cols)
    target = into or table.name
    types = _column_oids(raw, table.name, cols)
    # Binary COPY: psycopg packs each value in C, about 5x faster than the text format.
    with (
        raw.cursor() as cur,
        cur.copy(f'COPY "{target}" ({names}) FROM STDIN (FORMAT BINARY)') as copy,
    ):
        copy.set_types(types)
        for row in rows:
            copy.write_row(row)


#: Bytes of text sent per write of :func:`copy_lines`: few calls, little memory beside.
LINES_CHUNK = 1 << 20


def copy_lines(conn: Connection, into: str, column: str, lines: bytes) -> None:
    """Each line of UTF-8 ``lines`` as one row of text ``column`` of ``into``, verbatim
    (PostgreSQL: COPY).

    COPY's text format ends a row at each newline and reads backslash, tab and carriage
    return as its own: those are escaped here, a chunk at a time (C-speed replaces over
    the bytes, no Python per line). A multi-byte UTF-8 character never holds those bytes,
    so a chunk may end anywhere."""
    raw = conn.connection.driver_connection
    assert raw is not None
    with raw.cursor() as cur, cur.copy(f'COPY "{into}" ("{column}") FROM STDIN') as copy:
        for start in range(0, len(lines), LINES_CHUNK):
            chunk = lines[start : start + LINES_CHUNK]
            copy.write(chunk.replace(b"\\", b"\\\\").replace(b"\t", b"\\t").replace(b"\r", b"\\r"))


def pipe_rows(
    source: Connection,
    query: str,
    conn: Connection,
    table: Table,
    cols: Sequence[str],
    constants: Mapping[str, Any],
) -> int:
    """Append the rows ``query`` selects on ``source`` (its columns ``cols``, then
    ``constants`` added to each row) to ``table`` through ``conn``; how many (PostgreSQL).

    Server to server: the rows leave ``source`` by one binary COPY and enter ``table``
    by another, the bytes passed on as they come, unread. The query runs in one
    server process while another stores the rows, each on a core of its own, and
    COPY stores rows a page at a time where ``INSERT … SELECT`` stores them one by
    one. The constants are cast to their columns' types, so the binary rows are
    exactly the ones ``table`` reads.
    """
    from psycopg import sql

    raw_out = source.connection.driver_connection
    raw_in = conn.connection.driver_connection
    assert raw_out is not None and raw_in is not None
    types = _column_types(raw_in, table.name, list(constants))
    values = sql.SQL(", ").join(
        sql.SQL("CAST({} AS {})").format(sql.Literal(value), sql.SQL(type_))
        for value, type_ in zip(constants.values(), types, strict=True)
    )
    select = sql.SQL("COPY (SELECT given.*, {} FROM ({}) AS given) TO STDOUT (FORMAT BINARY)")
    names = ", ".join(f'"{c}"' for c in (*cols, *constants))
    with raw_out.cursor() as out_cur, raw_in.cursor() as in_cur:
        with (
            out_cur.copy(select.format(values, sql.SQL(query))) as rows_out,
            in_cur.copy(f'COPY "{table.name}" ({names}) FROM STDIN (FORMAT BINARY)') as rows_in,
        ):
            for data in rows_out:
                rows_in.write(data)
        return int(in_cur.rowcount)  # a closed cursor forgets it


_COLUMNS: dict[str, dict[str, tuple[int, str]]] = {}


def _columns(raw: Any, table: str) -> dict[str, tuple[int, str]]:
    """Per column of ``table``: its type's oid (for binary COPY) and its SQL type
    (``varchar(16)``, ``integer``, …), read once per table."""
    if table not in _COLUMNS:
        rows = raw.execute(
            "SELECT attname, atttypid::int, format_type(atttypid, atttypmod) FROM pg_attribute "
            "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
            (f'"{table}"',),
        ).fetchall()
        _COLUMNS[table] = {name: (oid, type_) for name, oid, type_ in rows}
    return _COLUMNS[table]


def _column_oids(raw: Any, table: str, cols: Sequence[str]) -> list[int]:
    """The PostgreSQL type oids of ``cols`` of ``table`` (for binary COPY)."""
    columns = _columns(raw, table)
    return [columns[c][0] for c in cols]


def _column_types(raw: Any, table: str, cols: Sequence[str]) -> list[str]:
    """The SQL types of ``cols`` of ``table``."""
    columns = _columns(raw, table)
    return [columns[c][1] for c in cols]


_STAGES: dict[str, Table] = {}


def _stage_table(table: Table) -> Table:
    name = f"_stage_{table.name}"
    if name not in _STAGES:
        _STAGES[name] = Table(name, MetaData(), *(Column(c.name, c.type) for c in table.columns))
    return _STAGES[name]


#: Keys, in a database connection's ``info``, of the temporary tables made on it: each
#: is created once per connection, not once per batch (``CREATE ... IF NOT EXISTS``
#: cost a catalog lookup and a notice on every commit of the log writer, 1.6 ms each
#: on bench/throughput.py's cycle). Made in the transaction under way (``_MAKING``)
#: until it commits; a rollback takes them away with it, and the next use makes
#: them again.
_MADE = "jodl_stages_made"
_MAKING = "jodl_stages_making"


def _stages(info: dict[Any, Any], committed: bool) -> None:
    making = info.pop(_MAKING, None)
    if making and committed:
        info.setdefault(_MADE, set()).update(making)


def _on_commit(conn: Connection) -> None:
    _stages(conn.connection.info, committed=True)


def _on_rollback(conn: Connection, *_: Any) -> None:
    with contextlib.suppress(Exception):  # a connection already invalidated
        _stages(conn.connection.info, committed=False)


def _on_reset(_dbapi: Any, record: Any, state: Any) -> None:
    if not state.transaction_was_reset:  # the pool rolls back a transaction left open
        _stages(record.info, committed=False)


event.listen(Engine, "commit", _on_commit)
event.listen(Engine, "rollback", _on_rollback)
event.listen(Engine, "rollback_savepoint", _on_rollback)  # which ones it held: unknown
event.listen(Pool, "reset", _on_reset)


@contextlib.contextmanager
def staged(
    conn: Connection,
    table: Table,
    cols: Sequence[str],
    rows: Sequence[Sequence[Any]],
    last: bool = False,
) -> Iterator[Table]:
    """``rows`` loaded into a temporary table shaped like ``table``, for set-based statements.

    One transfer (COPY on PostgreSQL) feeds several statements inside the
    database (insert, aggregates, joins); the table is emptied afterwards, or, with
    ``last`` (the transaction's last use of it), on PostgreSQL by the commit
    (``ON COMMIT DELETE ROWS``): a ``DELETE`` of 20,000 staged rows took 50 ms.
    """
    stage = _stage_table(table)
    info = conn.connection.info
    if stage.name not in info.get(_MADE, ()) and stage.name not in info.get(_MAKING, ()):
        shape = (
            f'(LIKE "{table.name}") ON COMMIT DELETE ROWS'
            if conn.dialect.name == "postgresql"
            else f'AS SELECT * FROM "{table.name}" WHERE 0'
        )
        conn.execute(text(f'CREATE TEMP TABLE IF NOT EXISTS "{stage.name}" {shape}'))
        info.setdefault(_MAKING, set()).add(stage.name)
    copy_rows(conn, table, cols, rows, into=stage.name)
    try:
        yield stage
    finally:
        if not (last and conn.dialect.name == "postgresql"):
            conn.execute(stage.delete())


_PREPARED: dict[tuple[str, str], TextClause] = {}


def prepared(
    conn: Connection, key: str, build: Callable[[], Any], **types: type[TypeEngine[Any]]
) -> TextClause:
    """``build()``'s statement as SQL text, compiled once per dialect (constants inlined).

    For big statements run once per batch: SQLAlchemy otherwise spends
    milliseconds per execution compiling or keying them. ``types`` name the bind
    parameters left in (``:name`` in the statement) and their types.
    """
    cache_key = (conn.dialect.name, key)
    stmt = _PREPARED.get(cache_key)
    if stmt is None:
        sql = str(build().compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True}))
        stmt = text(sql).bindparams(*(bindparam(n, type_=t) for n, t in types.items()))
        _PREPARED[cache_key] = stmt
    return stmt
