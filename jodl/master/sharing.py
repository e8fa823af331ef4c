"""A serving master's share of the families (docs/architecture.md#several-masters), and
leading again after a database outage (docs/architecture.md#database-outages).

Functions over a serving master (:class:`Sharer`) on PostgreSQL whose families are
spread over several masters (:class:`~jodl.master.leadership.Leadership` decides which
are this master's share): wait for a share, take and hand over families between
steps, and resume what a newly led family's last leader left.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Protocol

from ..exceptions import Fenced, LeaseHeld, Stopped
from ..log.store import Store
from ..log.writer import LogWriter
from .book import JobBook
from .feeder import Feeder, FeedHost
from .nodes import Nodes
from .outage import RETRY_EVERY, is_outage, lease_lapsed, reason
from .records import ActiveRun


class Sharer(FeedHost, Protocol):
    """What sharing reads and drives of a serving master
    (:class:`~jodl.master.loop.Master`), its feeders' view included."""

    store: Store
    fleet: Nodes
    writer: LogWriter
    book: JobBook
    runs: dict[int, ActiveRun]
    feeders: list[Feeder]
    #: Monotonic time of the next look at the leases.
    next_lead: float

    @property
    def epoch(self) -> int: ...

    def set_epoch(self, epoch: int) -> None: ...

    def requested(self) -> set[str]: ...

    def build(self) -> None: ...

    def start(self) -> None: ...

    def let_go(self, final: bool) -> None: ...

    def listen_for_hellos(self) -> None: ...


log = logging.getLogger("jodl.master")


def stand_by(master: Sharer, stop: threading.Event | None = None) -> bool:
    """Wait until ``master`` leads a share of the families (True) or ``stop`` is set
    (False); from then on it is a master of a share (``per_family``)."""
    if master.store.dialect == "sqlite":
        return True  # start() takes the lease or says who holds it
    master.per_family = True
    master.listen_for_hellos()  # agents register with standbys too
    stop = stop or threading.Event()
    while not stop.is_set():
        try:
            if master.leadership.poll(master.store.family_names()):
                return True
        except Exception as exc:
            if not is_outage(exc):
                raise
            log.warning("standing by: the database does not answer (%s)", reason(exc))
        stop.wait(master.leadership.next_look())
    return False


def rejoin(master: Sharer, exc: BaseException, stop: threading.Event | None) -> None:
    """After a database outage, or once fenced (another master took over its leases):
    ``master`` lets go of its agents and leases, then stands by until it leads again
    (:class:`Stopped` when ``stop`` is set first). A master of the whole database (a
    SQLite file's, a one-shot run's) that was taken over stops: :class:`Fenced`."""
    if not lease_lapsed(master.store, master.epoch):
        if not master.per_family:
            raise Fenced(f"another master took over: epoch {master.epoch} stops") from exc
        log.warning("taken over (%s): epoch %d stops, standing by", exc, master.epoch)
        master.let_go(final=False)  # writes nothing: every write of the old epoch is refused
    else:
        log.warning("the database does not answer (%s): stopped dispatching", reason(exc))
        master.let_go(final=False)
        master.store.engine.dispose()  # pooled connections of before the outage are dead
    if not lead_anew(master, stop or threading.Event(), "the database answers again"):
        raise Stopped("stopped while the database did not answer")


def stand_down(master: Sharer, stop: threading.Event) -> None:
    """``master`` handed every family it led over to other masters: it lets go of its
    agents and stands by as a master just started does (its epoch ended with its last
    lease: a write or a call under it would be refused once another master takes a
    lease), until it leads again or ``stop`` is set."""
    log.warning("master %s leads nothing now: standing by", master.name)
    master.let_go(final=False)
    lead_anew(master, stop)


def lead_anew(master: Sharer, stop: threading.Event, why: str = "") -> bool:
    """Build ``master``'s parts anew and stand by until it leads (True: started, and
    said with ``why``), or ``stop`` is set (False); a database outage meanwhile is
    waited out."""
    while not stop.is_set():
        try:
            master.build()
            if lead_again(master, stop):
                master.start()
                if why:
                    log.warning("%s: leading (epoch %d)", why, master.epoch)
                return True
        except Exception as again:
            if not is_outage(again):
                raise
            master.let_go(final=False)
            stop.wait(RETRY_EVERY)
    return False


def lead_again(master: Sharer, stop: threading.Event) -> bool:
    """After an outage: stand by for a share of the families (a master of a share), or
    take the whole database's lease once it is free (True) or ``stop`` is set first
    (False)."""
    if master.per_family:
        return stand_by(master, stop)
    while not stop.is_set():
        try:
            master.leadership.take()
            return True
        except LeaseHeld:
            stop.wait(master.leadership.next_look())
    return False


def adopt(master: Sharer, families: list[str] | None) -> None:
    """Newly led ``families`` (None: everything): resume the runs their last leader
    left unfinished, and adopt what it took."""
    for family_name in master.store.running_families():
        if families is None or family_name in families:
            master.request_cycle(family_name)
    for feeder in master.feeders:
        feeder.take_over(master, families)


def lead(master: Sharer) -> None:
    """At every look at the leases (TTL/10, or as a refused lease expires), between
    steps: take the free families hashing gives this master, hand over the idle ones
    it gives another live master."""
    if time.monotonic() < master.next_lead:
        return
    leadership = master.leadership
    want, give = leadership.plan(master.store.family_names(), lambda f: idle(master, f))
    if give:
        master.writer.flush()
        master.fleet.led = [f for f in leadership.families() or () if f not in give]
        # New sessions without them first (nothing is sent on the old ones), so the
        # next leader's newer epoch does not fence this master on the agents.
        master.fleet.reopen(master.epoch)
        for feeder in master.feeders:
            feeder.hand_over(give)
        leadership.give(give)
    if want:
        master.writer.flush()  # the epoch changes: nothing of the old one in flight
        taken = leadership.gain(want)
        if taken:
            master.set_epoch(leadership.epoch)
            # Agents learn the epoch and the families before the runs are resumed.
            master.fleet.reopen(master.epoch, wait=True)
            adopt(master, taken)
    master.next_lead = time.monotonic() + leadership.next_look()


def idle(master: Sharer, family: str) -> bool:
    """Nothing of ``family`` runs or waits in ``master``: it can move to another one."""
    if any(a.family.name == family for a in master.runs.values()):
        return False
    if family in master.requested():
        return False
    return not any(job.family == family for job in master.book.jobs.values())


__all__ = [
    "Sharer",
    "adopt",
    "idle",
    "lead",
    "lead_again",
    "lead_anew",
    "rejoin",
    "stand_by",
    "stand_down",
]
