"""The log package's gateway: execution ids, typed outcome batches, application reads."""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time

import pytest
from sqlalchemy import Connection, event, func, insert, select, text, update

from jodl.exceptions import BadPayload, Fenced, UnknownFamily
from jodl.log import Store, make_engine
from jodl.log.exec_ids import EXEC_ID_BLOCK, ExecIds
from jodl.log.family_admin import FamilyAdminLog
from jodl.log.migrate import upgrade
from jodl.log.models import Base, ExecIdSequence, ExecState, Job, JobState, utcnow
from jodl.log.records import (
    ClaimDone,
    ClaimFailed,
    DeadJob,
    ExecutionRow,
    OutcomeBatch,
    split_claims,
)
from jodl.log.writer import LogWriter, _merged
from tests.plans import plan_nodes


def execution(
    exec_id: int, job_id: int, run_id: int, state: str, result: str | None
) -> ExecutionRow:
    now = utcnow()
    return ExecutionRow(
        id=exec_id,
        run_id=run_id,
        job_id=job_id,
        node_id=1,
        attempt=1,
        state=state,
        backup=False,
        epoch=1,
        sent_at=now,
        started_at=now,
        finished_at=now,
        duration=0.5,
        result=result,
        error=None if state == ExecState.DONE else "boom",
    )


def open_run(store: Store, keys: list[str]) -> tuple[int, dict[str, int]]:
    family = store.ensure_family("gw")
    store.add_jobs(family, {k: {} for k in keys})
    run, _ = store.open_run(family, epoch=1)
    jobs = {j.key: j.id for j in store.run_jobs(run, "gw")}
    return run.id, jobs


def test_execution_ids_grow_and_are_never_reused_by_two_holders(store: Store) -> None:
    first = ExecIds(store.engine).take(3)
    second = ExecIds(store.engine).take(2)  # another process: a new block
    assert first == sorted(first) and len(set(first + second)) == 5
    assert min(second) >= max(first) + 1
    assert store.next_free_exec_id() > max(second)
    big = store.next_exec_ids(EXEC_ID_BLOCK + 5)  # more than a block at once
    assert len(set(big)) == EXEC_ID_BLOCK + 5 and min(big) > max(second)


def test_execution_ids_start_without_the_migration_row(db_url: str) -> None:
    from jodl.log import make_engine

    engine = make_engine(db_url)
    try:
        Base.metadata.create_all(engine)  # no migration: no sequence row yet
        assert ExecIds(engine).take(2) == [1, 2]
        with engine.connect() as conn:
            assert conn.scalar(select(ExecIdSequence.next_id)) == 1 + EXEC_ID_BLOCK
    finally:
        engine.dispose()


def test_claims_are_told_apart_by_type_not_length() -> None:
    due = utcnow()
    done, failed = split_claims([ClaimDone(1, 2), ClaimFailed(3, 4, "x", due), ClaimDone(5, 6)])
    assert done == [ClaimDone(1, 2), ClaimDone(5, 6)]
    assert failed == [ClaimFailed(3, 4, "x", due)]
    with pytest.raises(TypeError, match="ClaimDone or ClaimFailed"):
        split_claims([(1, 2)])  # type: ignore[list-item]


def test_an_outcome_batch_commits_results_learning_and_dead_jobs(store: Store) -> None:
    run_id, jobs = open_run(store, ["a", "b"])
    ids = store.next_exec_ids(3)
    writer = LogWriter(store)
    try:
        writer.submit(
            [
                execution(ids[0], jobs["a"], run_id, ExecState.DONE, '{"v": 1}'),
                execution(ids[1], jobs["b"], run_id, ExecState.FAILED, None),
            ],
            dead=[DeadJob(jobs["b"], "boom", run_id)],
            settle=True,
        )
        writer.flush()
    finally:
        writer.close()
    assert store.settled(ids) == {ids[0], ids[1]}
    assert store.count_run(run_id) == (1, 1)
    with store.session() as s:
        b = s.get(Job, jobs["b"])
        a = s.get(Job, jobs["a"])
        assert b is not None and b.state == JobState.DEAD and b.last_error == "boom"
        assert a is not None and a.permanent_node_id == 1  # settled at the node of its result
    # Reading through the public methods, as the applications do.
    rows = store.reads.results_since(run_id, 0, 10)
    assert [(r.job_id, r.result) for r in rows] == [(jobs["a"], '{"v": 1}')]
    assert store.reads.results_since(run_id, rows[-1].exec_id, 10) == []
    assert store.reads.dead_in_run(run_id) == {jobs["b"]: "boom"}
    assert store.reads.latest_results([jobs["a"], jobs["b"]]) == {
        jobs["a"]: [(ids[0], rows[0].finished_at)]
    }
    assert store.reads.newest_exec_ids([jobs["a"], jobs["b"]]) == {
        jobs["a"]: ids[0],
        jobs["b"]: ids[1],
    }
    assert store.reads.results_after({0: [jobs["a"]]}) == rows
    assert [(e.job_id, e.state) for e in store.reads.given_up(jobs.values())] == [
        (jobs["b"], JobState.DEAD)
    ]


def test_the_writer_closes_the_claims_of_consecutive_batches_in_one_statement_set(
    store: Store,
) -> None:
    """Batches of results and closed claims are written as one (one statement each per
    commit, not per batch); dead jobs and homes keep their place between them. Every
    claim still closes by its own attempt's guard: a stale attempt changes nothing."""
    from jodl.queue import Queue

    queue = Queue(store)
    queue.enqueue_many("od", ["a", "b", "c", "d"])
    claimed = {c.key: c for c in queue.claim(4, 60.0)}
    done = [ClaimDone(claimed[k].id, claimed[k].attempt) for k in ("a", "b")]
    stale = ClaimDone(claimed["d"].id, claimed["d"].attempt - 1)
    later = utcnow().replace(microsecond=0) + dt.timedelta(seconds=60)
    failed = ClaimFailed(claimed["c"].id, claimed["c"].attempt, "boom", later)
    batches = [
        OutcomeBatch(claims_done=done[:1]),
        OutcomeBatch(claims_done=[*done[1:], stale], closed=[7]),
        OutcomeBatch(claims_failed=[failed]),
        OutcomeBatch(homes=[(claimed["a"].id, None, None)]),
        OutcomeBatch(claims_done=[]),
    ]
    merged = _merged(batches)
    assert [len(b.claims_done) + len(b.claims_failed) for b in merged] == [4, 0, 0]
    assert merged[0].closed == [7] and merged[1].homes

    statements: list[str] = []

    def seen(conn, cursor, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        statements.append(statement)

    event.listen(store.engine, "before_cursor_execute", seen)
    try:  # the writer's commit of the three queued together (after a step on many agents)
        store.record_outcomes(*_merged(batches[:3]))
    finally:
        event.remove(store.engine, "before_cursor_execute", seen)
    closing = [s for s in statements if s.lstrip().upper().startswith("UPDATE JODL_JOB")]
    assert len(closing) == 2, closing  # one for the done claims, one for the failed
    got = {k: queue.get("od", k) for k in "abcd"}
    assert {k: j.state for k, j in got.items()} == {
        "a": JobState.DONE, "b": JobState.DONE, "c": JobState.QUEUED, "d": JobState.CLAIMED
    }  # fmt: skip
    assert got["c"] is not None and got["c"].last_error == "boom" and got["c"].due_at == later


def test_a_runs_executions_are_read_a_page_at_a_time(store: Store) -> None:
    keys = ["a_1", "ab1", "a%1", "b"]
    run_id, jobs = open_run(store, keys)
    ids = store.next_exec_ids(len(keys))
    writer = LogWriter(store)
    try:
        writer.submit(
            [
                execution(i, jobs[k], run_id, ExecState.DONE, '"' + "x" * 1000 + '"')
                for i, k in zip(ids, keys, strict=True)
            ],
            settle=True,
        )
        writer.flush()
    finally:
        writer.close()
    first = store.reads.run_executions(run_id, limit=3)
    assert [e.key for e in first] == keys[:3]
    assert len(first[0].result or "") == 300  # cut for a listing
    rest = store.reads.run_executions(run_id, after=first[-1].exec_id, limit=3)
    assert [e.key for e in rest] == ["b"]
    # The key is searched as text: "_" and "%" match only themselves.
    assert [e.key for e in store.reads.run_executions(run_id, key="a_")] == ["a_1"]
    assert [e.key for e in store.reads.run_executions(run_id, key="a%")] == ["a%1"]
    assert store.reads.run_executions(run_id, state=ExecState.FAILED) == []


def test_a_resumed_run_read_in_windows_is_the_run_read_at_once(store: Store) -> None:
    """A first window (the oldest due, and the jobs of logged executions wherever they
    are in that order) and the windows after it (those read early left out) make
    exactly the jobs left, each once."""
    keys = [f"k{i:02}" for i in range(30)]
    run_id, jobs = open_run(store, keys)
    ids = store.next_exec_ids(6)
    done = ["k00", "k01", "k02", "k03", "k20"]  # the oldest due are done, as after a kill
    writer = LogWriter(store)
    try:
        writer.submit(
            [
                execution(i, jobs[k], run_id, ExecState.DONE, "{}")
                for i, k in zip(ids, done, strict=False)
            ]
            + [execution(ids[5], jobs["k04"], run_id, ExecState.FAILED, None)],
            settle=True,
        )
        writer.flush()
    finally:
        writer.close()
    run = store.running_run("gw")
    assert run is not None
    whole = {j.id: j for j in store.run_jobs(run, "gw")}
    assert sorted(whole) == sorted(jobs[k] for k in keys if k not in done)
    sent = {jobs["k25"], jobs["k28"]}  # in flight, far down the order
    first = store.run_window(run, "gw", 6, also=sent)
    # The six oldest due members less those done: k04 (failed once: retried) and k05,
    # and those in flight.
    assert [j.key for j in first.jobs] == ["k04", "k05", "k25", "k28"]
    assert first.jobs[0].attempts == 1 and first.jobs[0].failed_on == {1}
    read, after = list(first.jobs), first.next_after
    while after is not None:  # windows of 7: k06-k12, k13-k19, k20-k26, k27-k29
        window = store.run_window(run, "gw", 7, after=after, leave=sent)
        read += window.jobs
        after = window.next_after
    assert sorted(j.id for j in read) == sorted(whole)
    assert len(read) == len(whole)  # none twice
    assert all(whole[j.id] == j for j in read)
    # A window of a run this master opened itself does not ask the log: done jobs
    # (which such a window cannot hold) are not left out then.
    unasked = store.run_window(run, "gw", 6, logged=False)
    assert [j.key for j in unasked.jobs] == ["k00", "k01", "k02", "k03", "k04", "k05"]


def test_windows_give_members_oldest_due_first_however_they_lie_among_the_ids(
    store: Store,
) -> None:
    """Members of three last runs (none among them), between runs of another family's
    jobs and far apart in ids: small windows give each member once, in the run's order
    (last run, then id), ids read in ranges that double over gaps."""
    gw, other = store.ensure_family("gw"), store.ensure_family("other")
    for block in range(4):
        store.add_jobs(gw, {f"g{block}-{i}": {} for i in range(5)})
        store.add_jobs(other, {f"o{block}-{i}": {} for i in range(40)})
    for _ in range(3):  # runs 1-3 of gw; its jobs then say which they last ran in
        run, _resumed = store.open_run(gw, epoch=1)
        store.finish_run(run, None, None)
    with store.engine.begin() as conn:
        ids = list(conn.scalars(select(Job.id).where(Job.family_id == gw.id).order_by(Job.id)))
        for n, job_id in enumerate(ids):
            last = (None, 3, 1)[n % 3]
            conn.execute(update(Job).where(Job.id == job_id).values(last_run_number=last))
    last_of = {job_id: (None, 3, 1)[n % 3] or 0 for n, job_id in enumerate(ids)}
    run, _resumed = store.open_run(gw, epoch=1)
    read: list[int] = []
    after = None
    while True:
        window = store.run_window(run, "gw", 3, after=after, logged=False)
        read += [j.id for j in window.jobs]
        if window.next_after is None:
            break
        after = window.next_after
    assert read == sorted(ids, key=lambda job_id: (last_of[job_id], job_id))


def test_a_window_reads_its_id_range_by_the_primary_key_on_a_table_without_statistics(
    pg_database: str,
) -> None:
    """Right after a bulk add (no statistics), a window's range read walks the primary
    key through its range alone, never a bitmap of the family's every job; the setting
    that makes it so is the range read's only: put back after it."""
    engine = make_engine(pg_database)
    upgrade(engine)
    store = Store(engine)
    gw, other = store.ensure_family("gw"), store.ensure_family("other")
    store.add_jobs(gw, {f"g{i}": {} for i in range(20_000)})
    store.add_jobs(other, {f"o{i}": {} for i in range(5_000)})
    with engine.connect() as conn:
        never = conn.scalar(text("SELECT reltuples < 0 FROM pg_class WHERE relname = 'jodl_job'"))
    run, _resumed = store.open_run(gw, epoch=1)
    statements: list[tuple[str, object]] = []

    def seen(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        statements.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", seen)
    try:
        first = store.run_window(run, "gw", 1_000, logged=False)
        second = store.run_window(run, "gw", 1_000, after=first.next_after, logged=False)
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert [j.key for j in first.jobs + second.jobs] == [f"g{i}" for i in range(2_000)]
    assert never
    ranges = [i for i, (s, _) in enumerate(statements) if "jodl_job.id > " in s]
    assert len(ranges) == 2
    for i in ranges:
        off, on = statements[i - 1], statements[i + 1]
        assert off[1] == {"n0": "enable_bitmapscan", "v0": "off"}
        assert on[1] == {"n0": "enable_bitmapscan", "v0": "on"}  # put back
        nodes = plan_nodes(engine, off, statements[i])
        assert not any("Bitmap" in n["Node Type"] for n in nodes)
        assert any(n.get("Index Name") == "pk_jodl_job" for n in nodes)
    engine.dispose()


def test_the_work_at_home_is_one_hash_join_in_one_process_on_a_table_without_statistics(
    pg_database: str,
) -> None:
    """Nodes' work at home reads every job of a family with what was learned of it: as
    one hash join, never a probe per job nor parallel workers (it runs beside a cycle)."""
    engine = make_engine(pg_database)
    upgrade(engine)
    store = Store(engine)
    family = store.ensure_family("gw")
    store.add_jobs(family, {f"g{i}": {} for i in range(5_000)})
    with engine.begin() as conn:
        conn.execute(update(Job).values(permanent_node_id=Job.id % 3 + 1))
        conn.execute(
            text(
                "INSERT INTO jodl_job_on_node (job_id, node_id, executions, failures,"
                " recent_duration, m2, updated_at) SELECT id, id % 3 + 1, 1, 0, 0.5, 0, now()"
                " FROM jodl_job"
            )
        )
    statements: list[tuple[str, object]] = []

    def seen(conn, cursor, statement, parameters, context, executemany) -> None:  # noqa: ANN001
        statements.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", seen)
    try:
        work = store.home_work(family.id, 1.0, None)
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert work == pytest.approx({1: 1666 * 0.5, 2: 1667 * 0.5, 3: 1667 * 0.5}, abs=1)
    setting, query = [(s, p) for s, p in statements if "SELECT 1" not in s]
    assert setting[1] == {
        "n0": "enable_nestloop", "v0": "off", "n1": "max_parallel_workers_per_gather", "v1": "0"
    }  # fmt: skip
    nodes = plan_nodes(engine, setting, query)
    assert any(n["Node Type"] == "Hash Join" for n in nodes)
    assert not any(n["Node Type"] in ("Nested Loop", "Gather", "Gather Merge") for n in nodes)
    engine.dispose()


def test_a_batch_is_empty_only_when_it_holds_nothing(store: Store) -> None:
    assert not OutcomeBatch(settle=True)
    assert OutcomeBatch(closed=[1])
    store.record_outcomes(OutcomeBatch())  # nothing to commit: no error


def test_the_lease_takes_an_epoch_and_fences_the_older_holder(store: Store) -> None:
    first = store.acquire_lease("host:1:a")
    second = store.acquire_lease("host:1:b", force=True)
    assert second == first + 1
    assert not store.renew_lease("host:1:a", first)
    assert store.renew_lease("host:1:b", second)
    store.release_lease(second)
    assert store.lease_holder() is None
    assert isinstance(store.cluster_id(), str) and store.cluster_id() == store.cluster_id()


def test_a_lease_given_up_while_its_holder_takes_it_again_stays_with_the_taker(
    store: Store, db_url: str
) -> None:
    """One process, two masters of one name: the closing one gives its lease up (its
    epoch) while the new one takes it (a new epoch). Whichever order the database puts
    them in, the new epoch holds the lease and renews it; the give-up does not vacate it.
    Before, a SQLite take read the rows outside its transaction, so the give-up landed
    between its read and its write and left the new epoch on a vacant lease."""
    first = store.acquire_lease("host:1:a")
    other = Store(make_engine(db_url))
    done = threading.Event()
    fired: list[threading.Thread] = []

    def give_up_now(conn, cursor, statement, parameters, context, executemany) -> None:
        if fired or "jodl_master_lease" not in statement or "!=" not in statement:
            return
        giver = threading.Thread(target=lambda: (other.release_lease(first), done.set()))
        fired.append(giver)
        giver.start()
        # Let the give-up land now if the database lets it (it must wait for the take).
        done.wait(1.0)

    event.listen(store.engine, "after_cursor_execute", give_up_now)
    try:
        second = store.acquire_lease("host:1:a")
    finally:
        event.remove(store.engine, "after_cursor_execute", give_up_now)
    assert fired, "the take read no lease rows"
    fired[0].join(30)
    assert done.is_set()
    assert second == first + 1
    assert store.renew_lease("host:1:a", second)
    assert store.lease_holder() == "host:1:a"
    other.engine.dispose()


def test_jobs_added_in_bulk_are_new_keys_only_in_the_order_given(store: Store) -> None:
    family = store.ensure_family("noop")
    assert store.add_jobs(family, [("a", {"n": 1}), ("b", "{}"), ("a", {"n": 2})]) == 2
    assert store.add_jobs(family, {"b": {"n": 9}, "c": {"n": 3}}, priority=5) == 1
    # More keys than one statement's batch, some the family has: only the new ones.
    many = [(f"k{i:05d}", {"i": i}) for i in range(12_000)]
    assert store.add_jobs(family, many[:1000]) == 1000
    assert store.add_jobs(family, many) == 11_000
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(Job.key, Job.payload, Job.priority, Job.state, Job.attempts, Job.every_n_cycles)
            .where(Job.family_id == family.id)
            .order_by(Job.id)
        ).all()
    assert [tuple(r) for r in rows[:3]] == [
        ("a", '{"n": 1}', 0, JobState.IDLE, 0, 1),
        ("b", "{}", 0, JobState.IDLE, 0, 1),
        ("c", '{"n": 3}', 5, JobState.IDLE, 0, 1),
    ]
    assert [r.key for r in rows[3:]] == [key for key, _ in many]


def test_jobs_copied_into_an_empty_family_keep_order_and_refuse_nothing_twice(
    store: Store,
) -> None:
    """To a family with no jobs the jobs are copied straight in (PostgreSQL); a key
    given twice, late in a long input, sends them the checked way: each key once, the
    first payload kept, in the order given."""
    family = store.ensure_family("noop")
    many = [(f"k{i}", {"i": i}) for i in range(3000)] + [("k7", {"i": -1}), ("last", {})]
    assert store.add_jobs(family, iter(many)) == 3001
    with store.engine.connect() as conn:
        rows = conn.execute(
            select(Job.key, Job.payload).where(Job.family_id == family.id).order_by(Job.id)
        ).all()
    assert [r.key for r in rows] == [f"k{i}" for i in range(3000)] + ["last"]
    assert rows[7].payload == '{"i": 7}'


def test_a_bad_payload_late_in_the_copy_adds_nothing_nor_the_family(store: Store) -> None:
    """The jobs are encoded while they are sent: a bad one late in the input ends the
    copy and the transaction, and the family ``create`` was to make is not made."""
    jobs = [(f"k{i}", {}) for i in range(5000)] + [("bad", [1, 2])]
    with pytest.raises(BadPayload, match="payload of job 'bad' "):
        store.add_jobs("fresh", iter(jobs), create=True)
    assert store.family("fresh") is None
    family = store.ensure_family("held")
    with pytest.raises(BadPayload, match="payload of job 'bad' "):
        store.add_jobs(family, iter(jobs))
    with store.engine.connect() as conn:
        assert conn.scalar(select(Job.id).limit(1)) is None


def test_jobs_added_by_a_master_fenced_out_are_refused(store: Store) -> None:
    """A store fenced with an epoch no lease carries (a master taken over) adds no job:
    the copy into an empty family proves the epoch as a statement through SQLAlchemy
    does."""
    family = store.ensure_family("noop")
    with pytest.raises(Fenced):
        store.fenced(lambda: 999).add_jobs(family, [("a", {}), ("b", {})])
    with store.engine.connect() as conn:
        assert conn.scalar(select(Job.id).limit(1)) is None


def test_keys_another_transaction_adds_meanwhile_are_kept(pg_database: str) -> None:
    """Jobs for a family with no jobs yet go in without a check per row; when another
    transaction adds some of the same keys meanwhile, the add keeps those (theirs) and
    adds the others, still in one transaction."""
    engine = make_engine(pg_database)
    upgrade(engine)
    store = Store(engine)
    family = store.ensure_family("noop")
    added: list[int] = []
    with engine.connect() as other, engine.connect() as watch:
        other.execute(insert(Job).values(family_id=family.id, key="b", payload='{"by": 1}'))
        adding = threading.Thread(
            target=lambda: added.append(store.add_jobs(family, [(k, {}) for k in "abc"]))
        )
        adding.start()
        deadline = time.monotonic() + 30
        waiting = text(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        while not watch.scalar(waiting):  # the add waits for the other's key "b"
            watch.rollback()  # the next read sees pg_stat_activity anew
            assert time.monotonic() < deadline and adding.is_alive()
            time.sleep(0.01)
        other.commit()
        adding.join(30)
    assert added == [2]
    with engine.connect() as conn:
        rows = conn.execute(select(Job.key, Job.payload).where(Job.family_id == family.id))
        assert dict(rows.all()) == {"a": "{}", "b": '{"by": 1}', "c": "{}"}
    engine.dispose()


def test_a_run_records_a_ratio_only_where_it_means_something(store: Store) -> None:
    """Issue 24: the stored ratio (``jodl status``, the operators' page) follows
    :func:`jodl.log.runs.makespan_ratio`: none for tiny jobs, none below 1."""
    family = store.ensure_family("gw")
    for makespan, bound, ratio in [(3.0, 2.0, 1.5), (0.483, 0.001, None), (0.82, 1.0, None)]:
        store.add_jobs(family, {f"k{makespan}": {}})
        run, _ = store.open_run(family, epoch=1)
        finished = store.finish_run(run, makespan, bound)
        assert finished.lower_bound == bound
        assert finished.ratio == (pytest.approx(ratio) if ratio else None)
        (shown,) = [r for r in store.reads.overview(runs=1)["runs"] if r["id"] == run.id]
        assert shown["ratio"] == finished.ratio


def test_the_store_has_one_door_to_each_statement(store: Store) -> None:
    """Two parts of the store are public (the masters' registry and the applications'
    reads) and it repeats none of their methods; every other part is private, reached
    through the store's own methods only."""
    from jodl.log.masters import MasterRegistry
    from jodl.log.reads import Reads

    def public(kind: type) -> set[str]:
        return {name for name in dir(kind) if not name.startswith("_")}

    parts = {
        name
        for name, value in vars(store).items()
        if not name.startswith("_")
        and hasattr(value, "engine")
        and name not in ("engine", "fenced_engine")
    }
    assert parts == {"masters", "reads"}
    assert isinstance(store.masters, MasterRegistry) and isinstance(store.reads, Reads)
    assert not public(MasterRegistry) & public(Store)
    assert not public(Reads) & public(Store)


def test_jobs_added_to_a_family_removed_meanwhile_are_refused(store: Store) -> None:
    """No foreign key checks each new job: the add itself finds the family gone."""
    family = store.ensure_family("gone")
    FamilyAdminLog(store.engine).remove("gone")
    with pytest.raises(UnknownFamily, match="not in the database"):
        store.add_jobs(family, [("a", {}), ("b", {})])
    with store.engine.connect() as conn:
        assert conn.scalar(select(Job.id).where(Job.family_id == family.id)) is None


def test_a_staging_table_is_made_once_per_connection_and_again_after_a_rollback(
    db_url: str,
) -> None:
    """The log writer stages each commit's outcomes in a temporary table: made on the
    first use of a connection, not again on the next commits; made in a transaction
    that rolls back, it is gone, and the next use makes it again."""
    from jodl.log import bulk
    from jodl.log.models import Execution
    from jodl.log.records import EXEC_COLUMNS

    engine = make_engine(db_url, pool_size=1, max_overflow=0)
    upgrade(engine)
    made: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _seen(_conn, _cur, statement, *_args) -> None:  # type: ignore[no-untyped-def]
        if statement.startswith("CREATE TEMP TABLE"):
            made.append(statement)

    class Undone(Exception):
        pass

    def stage(conn: Connection, rows: int, fail: bool = False) -> int:
        with contextlib.suppress(Undone), conn.begin():
            executions = [execution(i, i, 1, ExecState.DONE, "{}") for i in range(1, rows + 1)]
            with bulk.staged(conn, Execution.__table__, EXEC_COLUMNS, executions) as table:
                count = conn.scalar(select(func.count()).select_from(table))
            if fail:
                raise Undone
        return int(count)

    try:
        for rows in (3, 2):
            with engine.connect() as conn:
                assert stage(conn, rows) == rows
        assert len(made) == 1, "one pooled connection: the table is made once"
        engine.dispose()  # a new connection: the table is made on it, then rolled back
        with engine.connect() as conn:  # in the same connection's next transaction...
            assert stage(conn, 1, fail=True) == 1
            assert stage(conn, 4) == 4, "...it is made again"
        assert len(made) == 3
        with engine.connect() as conn:
            assert stage(conn, 1, fail=True) == 1  # made before: stays
        with engine.connect() as conn:
            assert stage(conn, 5) == 5
        assert len(made) == 3
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_arrays_travel_as_their_text_and_read_back_exactly(pg_database: str) -> None:
    """Claims' ids and attempts, and the enqueue's keys and payloads, go to PostgreSQL as
    the text of an array, cast there: every value comes back as it was (quotes,
    backslashes, braces, commas, blanks, the word NULL, an empty string), NULLs stay
    NULL, and something that is not an integer fails the cast instead of becoming one."""
    from sqlalchemy.exc import DataError

    from jodl.log import bulk

    values = [1, None, 0, -7, 2**62, 12345678901]
    in_order = "SELECT v FROM unnest(CAST(:a AS BIGINT[])) WITH ORDINALITY AS t(v, n) ORDER BY n"
    engine = make_engine(pg_database)
    try:
        with engine.connect() as conn:
            back = conn.scalars(text(in_order), {"a": bulk.int_array(values)}).all()
            assert back == values
            empty = bulk.int_array([])
            assert conn.scalar(text("SELECT cardinality(CAST(:a AS INT[]))"), {"a": empty}) == 0
            texts = ['a"b', "c\\d", "{e,f}", " g ", "NULL", "", "é\n\t€", '\\"', None, "h,i"]
            text_order = in_order.replace("BIGINT[]", "TEXT[]")
            assert conn.scalars(text(text_order), {"a": bulk.text_array(texts)}).all() == texts
            with pytest.raises(DataError, match="malformed array literal"):
                bad = bulk.int_array(["1},{2"])  # type: ignore[list-item]
                conn.execute(text("SELECT CAST(:a AS BIGINT[])"), {"a": bad})
    finally:
        engine.dispose()
