"""``jodl jobs add FAMILY --from FILE``: PostgreSQL parses the lines itself
(:meth:`Store.add_job_lines`), SQLite's are read in Python; on both, a bad line is
named by its number with nothing added, and adding a file again adds nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import select
from test_cli_errors import counts, jodl, one_line_error

from jodl.log import Job, Store
from jodl.log.models import FamilyRow


def add(db_url: str, path: Path, family: str = "sleep", *more: str) -> str:
    out = jodl("jobs", "add", family, "--from", str(path), *more, env={"JODL_DATABASE_URL": db_url})
    assert out.code == 0, out.stderr
    return out.stdout.strip()


def payloads(store: Store, family: str = "sleep") -> dict[str, str]:
    with store.session() as s:
        rows = s.execute(
            select(Job.key, Job.payload).join(FamilyRow, FamilyRow.id == Job.family_id)
            .where(FamilyRow.name == family)
        )  # fmt: skip
        return dict(rows.all())


def test_keys_and_payloads_arrive_as_written(store: Store, db_url: str, tmp_path: Path) -> None:
    """Escapes, tabs, backslashes, non-ASCII text and CRLF line ends survive the trip
    (PostgreSQL's COPY reads backslashes and tabs as its own: they must reach the
    server verbatim); blank lines are skipped; a payload keeps its keys' order."""
    path = tmp_path / "jobs.jsonl"
    lines = [
        r'{"key": "tab\there", "payload": {"s": "back\\slash \"quoted\" \u00e9 é", "n": 1.50}}',
        '{"key": "crlf", "payload": {"z": 1, "a": [1, {"b": null}]}}\r',
        "",
        '{"payload": {}, "key": "no-payload-first"}',
        '{"key": "bare"}',
        '{"key": "with\\\\backslash\\n", "payload": {"t": "a\\tb"}}',
    ]
    path.write_bytes(("\n".join(lines) + "\n").encode())
    assert add(db_url, path) == "5 jobs added to sleep"
    got = payloads(store)
    assert set(got) == {"tab\there", "crlf", "no-payload-first", "bare", "with\\backslash\n"}
    assert json.loads(got["tab\there"]) == {"s": 'back\\slash "quoted" é é', "n": 1.5}
    assert list(json.loads(got["crlf"])) == ["z", "a"], "the payload's keys keep their order"
    assert json.loads(got["crlf"]) == {"z": 1, "a": [1, {"b": None}]}
    assert got["bare"] == "{}" and got["no-payload-first"] == "{}"
    assert json.loads(got["with\\backslash\n"]) == {"t": "a\tb"}
    if store.dialect == "postgresql":  # parsed by the server: the payload as written
        assert got["tab\there"].endswith('\\u00e9 é", "n": 1.50}')
    assert add(db_url, path) == "0 jobs added to sleep (5 keys existed)"


@pytest.mark.parametrize(
    ("bad", "said"),
    [
        ('{"key": 7, "payload": {}}', 'expected {"key": "...", "payload": {...}}'),
        ('{"key": "", "payload": {}}', 'expected {"key": "...", "payload": {...}}'),
        ('["key", "x"]', 'expected {"key": "...", "payload": {...}}'),
        ('{"key": "x", "payload": [1]}', "payload is not a JSON object"),
        ('{"key": "x", "payload": null}', "payload is not a JSON object"),
        ('{"key": "x", "payload": {"a": 1}', "not JSON"),
        ('{"key": "k1"}', "key 'k1' repeats line 2"),
    ],
)
def test_a_bad_line_is_named_and_nothing_is_added(
    store: Store, db_url: str, tmp_path: Path, bad: str, said: str
) -> None:
    """To a family that does not exist yet (not even it is added) and to one with
    jobs (its jobs stay as they were)."""
    path = tmp_path / "jobs.jsonl"
    good = [f'{{"key": "k{i}", "payload": {{"seconds": 0}}}}' for i in range(5)]
    path.write_text("\n".join([*good[:3], bad, *good[3:]]) + "\n")
    env = {"JODL_DATABASE_URL": db_url}
    one_line_error(jodl("jobs", "add", "sleep", "--from", str(path), env=env), f"line 4: {said}")
    assert counts(store) == (0, 0), "nothing half-added, not even the family"
    (tmp_path / "first.jsonl").write_text('{"key": "k0"}\n{"key": "old"}\n')
    assert add(db_url, tmp_path / "first.jsonl") == "2 jobs added to sleep"
    one_line_error(jodl("jobs", "add", "sleep", "--from", str(path), env=env), f"line 4: {said}")
    assert payloads(store) == {"k0": "{}", "old": "{}"}, "nothing half-added"


def test_a_file_partly_added_before_adds_the_rest(
    store: Store, db_url: str, tmp_path: Path
) -> None:
    first, second = tmp_path / "first.jsonl", tmp_path / "second.jsonl"
    first.write_text("".join(f'{{"key": "k{i}"}}\n' for i in range(3)))
    second.write_text(
        " \t\n".join(f'{{"key": "k{i}", "payload": {{"n": {i}}}}}\n' for i in range(5))
    )  # lines of blanks between the jobs: skipped (read in Python on PostgreSQL too)
    assert add(db_url, first) == "3 jobs added to sleep"
    assert add(db_url, second) == "2 jobs added to sleep (3 keys existed)"
    got = payloads(store)
    assert got["k0"] == "{}", "a key the family had keeps its payload"
    assert json.loads(got["k4"]) == {"n": 4}
    assert add(db_url, second) == "0 jobs added to sleep (5 keys existed)"


def test_a_new_family_takes_the_given_strategy_and_an_empty_file_adds_none(
    store: Store, db_url: str, tmp_path: Path
) -> None:
    path = tmp_path / "jobs.jsonl"
    path.write_text("\n\n")
    env = {"JODL_DATABASE_URL": db_url}
    one_line_error(jodl("jobs", "add", "sleep", "--from", str(path), env=env), "no jobs in it")
    assert counts(store) == (0, 0)
    path.write_text('{"key": "a"}\n')
    assert add(db_url, path, "sleep", "--strategy", "round_robin", "--max-attempts", "4") == (
        "1 jobs added to sleep"
    )
    family = store.family("sleep")
    assert family is not None and (family.strategy, family.max_attempts) == ("round_robin", 4)


def test_the_store_parses_lines_on_postgresql_only(store: Store) -> None:
    """PostgreSQL adds the lines itself; elsewhere, or for a bad line, the store says
    None and writes nothing: the command then reads them in Python."""
    lines = b'{"key": "a"}\n{"key": "b", "payload": {"n": 1}}\n'
    done = store.add_job_lines("sleep", lines)
    if store.dialect != "postgresql":
        assert done is None and store.family("sleep") is None
        return
    assert done is not None and (done.added, done.given) == (2, 2)
    assert store.add_job_lines("sleep", lines + b'{"key": "c"}\n') == (1, 3)
    assert store.add_job_lines("sleep", b'{"key": "d"}\n{"key": "d"}\n') is None
    assert store.add_job_lines("other", b"nope\n") is None
    assert store.family("other") is None
    assert sorted(payloads(store)) == ["a", "b", "c"]
