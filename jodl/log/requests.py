"""What is asked of the running master: cycles (``jodl run`` beside a serving master),
the end of a running cycle (``jodl run cancel``), stopping deleted jobs (``jodl jobs delete``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection, Engine, insert, select, update
from sqlalchemy.orm import sessionmaker

from .models import RequestKind, RunRequest, utcnow


class Request(NamedTuple):
    """A request a master took: its id, family and :class:`RequestKind`."""

    id: int
    family: str
    kind: str


class RequestLog:
    """The ``jodl_run_request`` rows: asked, taken by one master, settled."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)

    def request_run(self, family: str, kind: str = RequestKind.RUN) -> int:
        """Record that ``kind`` (a cycle by default) is asked of the running master about
        ``family``; the request's id."""
        with self.sessions() as s, s.begin():
            row = RunRequest(family=family, kind=kind, requested_at=utcnow())
            s.add(row)
            s.flush()
            return row.id

    @staticmethod
    def file(conn: Connection, families: Iterable[str], kind: str) -> None:
        """Ask ``kind`` about each of ``families`` in the caller's transaction (e.g. with
        the jobs it deletes, so that a running master sees both or neither)."""
        rows = [{"family": f, "kind": kind, "requested_at": utcnow()} for f in sorted(families)]
        if rows:
            conn.execute(insert(RunRequest), rows)

    def take_run_requests(
        self, taker: str, families: Sequence[str] | None = None
    ) -> list[tuple[int, str]]:
        """Take every untaken request for a cycle (of ``families``; None: of any):
        (request id, family) pairs, oldest first."""
        requests = self.take_requests(taker, (RequestKind.RUN,), families)
        return [(r.id, r.family) for r in requests]

    def take_requests(
        self, taker: str, kinds: Sequence[str], families: Sequence[str] | None = None
    ) -> list[Request]:
        """Take every untaken request of these kinds (about ``families``; None: any
        family) for ``taker``, oldest first.

        A conditional UPDATE: of two masters taking at once, one gets each request.
        """
        if families is not None and not families:
            return []
        query = select(RunRequest.id, RunRequest.family, RunRequest.kind).where(
            RunRequest.taken_at.is_(None), RunRequest.kind.in_(list(kinds))
        )
        if families is not None:
            query = query.where(RunRequest.family.in_(list(families)))
        with self.engine.begin() as conn:
            rows = conn.execute(query.order_by(RunRequest.id)).all()
            if not rows:
                return []
            taken = set(
                conn.scalars(
                    update(RunRequest)
                    .where(RunRequest.id.in_([r[0] for r in rows]), RunRequest.taken_at.is_(None))
                    .values(taken_at=utcnow(), taken_by=taker[:255])
                    .returning(RunRequest.id)
                )
            )
        return [Request(*r) for r in rows if r[0] in taken]

    def adopt(self, leader: str, families: Sequence[str] | None = None) -> list[tuple[int, str]]:
        """Requests taken by another master but not settled become ``leader``'s (that
        master lost the lease of their family, of ``families``: ``leader`` holds it now);
        (request id, family) pairs."""
        if families is not None and not families:
            return []
        about = () if families is None else (RunRequest.family.in_(list(families)),)
        with self.engine.begin() as conn:
            rows = conn.execute(
                update(RunRequest)
                .where(
                    RunRequest.taken_at.is_not(None),
                    RunRequest.finished_at.is_(None),
                    RunRequest.taken_by != leader[:255],
                    *about,
                )
                .values(taken_by=leader[:255])
                .returning(RunRequest.id, RunRequest.family)
            ).all()
        return sorted((r[0], r[1]) for r in rows)

    def settle_run_request(self, request_id: int, taker: str, **outcome: Any) -> None:
        """Record a request's outcome: ``run_id``, ``summary`` and ``dead``, or ``error``.

        Only while ``taker`` has it: a master that lost its lease (the request was
        freed for the next leader) changes nothing.
        """
        with self.engine.begin() as conn:
            conn.execute(
                update(RunRequest)
                .where(RunRequest.id == request_id, RunRequest.taken_by == taker[:255])
                .values(finished_at=utcnow(), **outcome)
            )

    def run_request(self, request_id: int) -> RunRequest | None:
        with self.sessions() as s:
            return s.get(RunRequest, request_id)
