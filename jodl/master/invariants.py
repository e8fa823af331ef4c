"""The job book's invariants, asserted (O(jobs): for tests; see :mod:`jodl.master.book`)."""

from __future__ import annotations

from .book import JobBook, Stage


def check_book(book: JobBook) -> None:
    """Assert the invariants listed in :mod:`jodl.master.book`'s docstring."""
    assert book.jobs.keys() == book.stage.keys(), "1: one stage per held job"
    n_waiting = sum(1 for s in book.stage.values() if s is Stage.WAITING)
    assert book.n_waiting == n_waiting, "1: waiting jobs counted"
    waiting = set(book.waiting_line)
    queued: dict[int, int] = {}
    for node_id, queue in book.queues.items():
        for job_id in queue:
            assert job_id not in queued, f"3: job {job_id} queued twice"
            queued[job_id] = node_id
    execs: dict[int, list[int]] = {}
    per_dispatch: dict[int, int] = {}
    for node_id, flights in book.flights.items():
        for exec_id, sent in flights.items():
            assert sent.node_id == node_id and sent.exec_id == exec_id, "4: filed right"
            assert book.stage.get(sent.job_id) is Stage.IN_FLIGHT, f"4: {sent.job_id}"
            execs.setdefault(sent.job_id, []).append(exec_id)
            per_dispatch[sent.dispatch_id] = per_dispatch.get(sent.dispatch_id, 0) + 1
    for job_id, stage in book.stage.items():
        if stage is Stage.WAITING:
            assert job_id in waiting, f"2: waiting job {job_id} not in line"
            assert job_id not in book.placed and job_id not in queued, f"2: {job_id}"
        elif stage is Stage.QUEUED:
            placed = book.placed.get(job_id)
            assert placed is not None and queued.get(job_id) == placed[0], f"3: {job_id}"
        else:
            assert job_id in book.placed and job_id not in queued, f"4: {job_id}"
            n = len(execs.get(job_id, ()))
            copies = book.copies.get(job_id)
            assert n == (len(copies) if copies else 1), f"4: {job_id} has {n} executions"
        assert stage is not Stage.IN_FLIGHT or job_id in execs
    for job_id in book.copies:
        assert len(book.copies[job_id]) >= 2, "4: copies listed from two on"
    flying = {e for f in book.flights.values() for e in f}
    assert book.backups <= flying, "5: a backup copy is in flight"
    assert per_dispatch == book.dispatch_left, "6: open dispatches count their executions"
    for node_id, load in book.loads.items():
        on = sum(1 for n, _e in book.placed.values() if n == node_id)
        assert load.queued_jobs == on, f"7: node {node_id} counts {load.queued_jobs} != {on}"
    for job_id in book.retry_on:
        assert book.stage.get(job_id) is Stage.WAITING, f"8: {job_id}"
