"""Progress of long jobs, relayed from the agents to the log (``jodl.progress``).

About once a second (the node refresh), the master asks each agent that runs a job
sent more than :data:`ASK_AFTER` seconds ago for its running jobs' reports, keeps those
of executions it has in flight there, and writes the new ones in one transaction
(fenced, like every write of the master). Agents running only short jobs are not
asked: a no-op cycle pays nothing for it. A run's reports go when it ends.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol, TypeVar

from ..agent.replies import ProgressReport
from ..log.models import utcnow
from ..log.records import ProgressRow, Sent
from ..log.store import Store

#: Seconds a job must have been out before its agent is asked how far it is: a job
#: shorter than the refresh period would end before its report could be shown.
ASK_AFTER = dt.timedelta(seconds=2)


class Asked(Protocol):
    """What the relay needs of a node slot."""

    @property
    def id(self) -> int: ...

    @property
    def usable(self) -> bool: ...


S = TypeVar("S", bound=Asked)


class ProgressRelay:
    """Asks for reports, writes those that changed."""

    def __init__(self) -> None:
        #: exec id -> the time of its report last written (a report is written once).
        self.written: dict[int, float] = {}

    def poll(
        self,
        slots: Iterable[S],
        flights: Mapping[int, Mapping[int, Sent]],
        ask: Callable[[S], tuple[ProgressReport, ...] | None],
        store: Store,
    ) -> None:
        """One ``progress`` call per agent running a long job; new reports written."""
        before = utcnow() - ASK_AFTER
        rows: list[ProgressRow] = []
        for slot in slots:
            running = flights.get(slot.id)
            if not slot.usable or not running:
                continue
            if min(sent.sent_at for sent in running.values()) > before:
                continue
            for report in ask(slot) or ():
                sent = running.get(report.exec_id)
                if sent is None or self.written.get(report.exec_id) == report.at:
                    continue  # another master's job, or nothing new
                self.written[report.exec_id] = report.at
                at = dt.datetime.fromtimestamp(report.at, dt.UTC).replace(tzinfo=None)
                rows.append(
                    ProgressRow(
                        report.exec_id, sent.run_id, sent.job_id, slot.id,
                        report.done, report.total, report.note, at,
                    )
                )  # fmt: skip
        if len(self.written) > 4 * max(1, sum(len(f) for f in flights.values())):
            flying = {exec_id for f in flights.values() for exec_id in f}
            self.written = {k: v for k, v in self.written.items() if k in flying}
        store.record_progress(rows)


__all__ = ["ASK_AFTER", "ProgressRelay"]
