"""What is asked of the running master beside cycles: cancel a run, stop deleted jobs.

``jodl run cancel FAMILY`` and ``jodl jobs delete FAMILY KEY...`` (and applications
deleting jobs through :class:`jodl.log.jobs.JobLog`) file requests in the log
(:class:`~jodl.log.models.RequestKind`). :class:`Controls` takes them once every
:data:`CONTROL_POLL` seconds from the loop and acts through the job book's ``cancel``
transition (via :meth:`Outcomes.cancel`): unsent jobs leave the book, executions in
flight are closed as cancelled and cancelled on their agents. See docs/architecture.md.
"""

from __future__ import annotations

import logging
import time

from ..log.models import RequestKind
from .outcomes import Outcomes
from .parts import Parts
from .records import ActiveRun

log = logging.getLogger("jodl.master")

#: Seconds between two looks for cancel and delete requests: one small SELECT; a
#: cancel is acted on within this (plus one loop step) of being asked.
CONTROL_POLL = 0.5
#: The kinds of request :class:`Controls` takes (cycles are taken by the serving
#: master's ``RunRequests`` feeder).
KINDS = (RequestKind.CANCEL, RequestKind.DELETE)


class Controls:
    """Takes cancel and delete requests for one master and settles them."""

    def __init__(self, parts: Parts, outcomes: Outcomes, poll: float = CONTROL_POLL) -> None:
        self.parts = parts
        self.store = parts.store
        self.book = parts.book
        self.outcomes = outcomes
        self.runs = parts.runs
        self.poll_every = poll
        self._last = 0.0
        #: request id -> the run it cancelled, settled once the loop closed that run.
        self._cancelling: dict[int, ActiveRun] = {}

    def poll(self) -> None:
        """Settle cancels whose run closed; every ``poll_every`` seconds take new requests."""
        self.settle_closed()
        now = time.monotonic()
        if now - self._last < self.poll_every:
            return
        self._last = now
        for request in self.store.take_requests(
            self.parts.name, KINDS, self.parts.leadership.families()
        ):
            try:
                if request.kind == RequestKind.CANCEL:
                    self._cancel(request.id, request.family)
                else:
                    self._delete(request.id, request.family)
            except Exception as exc:  # noqa: BLE001 - recorded for the asking command
                log.exception("request %d (%s %s) failed", request.id, request.kind, request.family)
                self.store.settle_run_request(request.id, self.parts.name, error=str(exc))

    def settle_closed(self) -> None:
        """Record the outcome of cancels whose run the loop closed (also when the master stops)."""
        for request_id, active in list(self._cancelling.items()):
            if active.run.id not in self.runs:
                del self._cancelling[request_id]
                self.store.settle_run_request(
                    request_id,
                    self.parts.name,
                    run_id=active.run.id,
                    summary=_cancelled_line(active),
                    dead=0,
                )

    def _cancel(self, request_id: int, family: str) -> None:
        """End the family's running cycle: its jobs still in the book are cancelled
        (unsent ones are never sent); the loop then closes the run as cancelled."""
        active = next((a for a in self.runs.values() if a.family.name == family), None)
        if active is None:
            # Not run by this master (e.g. left unfinished by a stopped one): closed here.
            run = self.store.cancel_open_run(family)
            if run is None:
                self.store.settle_run_request(
                    request_id, self.parts.name, error=f"no running cycle of {family}"
                )
            else:
                line = f"run {family}#{run.number} cancelled: {run.jobs_done} done"
                self.store.settle_run_request(
                    request_id, self.parts.name, run_id=run.id, summary=line, dead=0
                )
            return
        ids = [j for j, job in self.book.jobs.items() if job.run_id == active.run.id]
        cancelled = self.outcomes.cancel(ids, "run cancelled")
        active.cancelled = True
        active.remaining = 0
        self._cancelling[request_id] = active
        log.info(
            "run %s#%d cancelled: %d unfinished jobs stopped",
            family,
            active.run.number,
            cancelled,
            extra={"run_id": active.run.id, "family": family},
        )

    def _delete(self, request_id: int, family: str) -> None:
        """Jobs of ``family`` were deleted: those this master holds are cancelled."""
        held = [j for j, job in self.book.jobs.items() if job.family == family]
        deleted = self.store.deleted_among(held) if held else []
        cancelled = self.outcomes.cancel(deleted, "job deleted") if deleted else 0
        if cancelled:
            log.info("%d deleted jobs of %s cancelled", cancelled, family)
        self.store.settle_run_request(
            request_id,
            self.parts.name,
            summary=f"{cancelled} deleted jobs of {family} stopped",
            dead=0,
        )


def _cancelled_line(active: ActiveRun) -> str:
    return (
        f"run {active.family.name}#{active.run.number} cancelled: "
        f"{active.done}/{active.total} done, {active.dead} dead"
    )


__all__ = ["CONTROL_POLL", "Controls"]
