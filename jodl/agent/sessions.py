"""Whom an agent serves: a session per master connection, and the leader of each family.

Several masters may share an agent, each leading its own families (one leader per
family, docs/architecture.md#several-masters). Every ``init`` opens a session for a
master and names the families it leads at its epoch; an execution belongs to the
session that leads its family *now*, whichever session sent it. So a master that
takes a family over collects the results its predecessor's executions left here,
and only it can cancel them or take them back.

Every call after ``init`` carries ``(epoch, session, since)``, where ``since`` is the
master's time since its previous call; a call of an older session (a connection the
master gave up) is refused. A session silent for longer than the detach time starts
nothing of its families. Its next call resumes it if the master was only slow (its
``since`` covers the silence); if not (this agent was frozen or cut off while the
master gave up on it), the call is refused and the session closed. After every
``init`` the session's families start nothing until the master's next call, which
cancels the executions it gave up on: nothing it sent before the gap runs after its
result was committed elsewhere.

Fencing is per family: a session naming a family at an epoch older than the one
the family was last led at is refused (:data:`~jodl.agent.replies.FENCED`), and so is
every later call of a session one of whose families another master took since.
Each session is *detached* on its own: a silent master stops the start of its
families' jobs, not of the others'.

A fence *lapses* when the session that set it has been silent for the fence hold
(``JODL_AGENT_FENCE_HOLD``, longer than a lease TTL plus a call timeout): then a
master of any epoch may lead the family here again. The agent cannot tell an epoch
the database issued from one a holder of its key made up (say 2**62), so this is
what keeps a forged ``init`` from locking the real leader out until a restart. It
gives a stale master nothing: a live leader talks to its agents far more often than
the hold, and a master whose lease was taken stops dispatching within a lease TTL,
before the hold ends (docs/architecture.md, "Forged epochs").

Everything here runs under the agent core's lock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..exceptions import JodlError
from ..settings.config import DEFAULT_FENCE_HOLD, DETACH_SHARE
from .replies import FENCED


@dataclass
class Session:
    """One master connection, from its ``init`` on."""

    number: int
    master_id: str
    epoch: int
    families: frozenset[str]
    #: Monotonic time of its last accepted call.
    heard: float
    #: Its families' jobs start nothing: set by init until the master's next call.
    paused: bool = True
    #: Execution ids whose outcome this session was handed and has not acknowledged:
    #: not handed to it again. Its master keeps them until their commit (it acknowledges
    #: after it), and a master that lost a reply lost its connection with it (any failed
    #: call closes it): its next session gets them all again. Handed again on every call,
    #: they were 42 % of the results a cycle of no-op jobs shipped, and the agent's
    #: encoding of them most of its time serving the master.
    handed: set[int] = field(default_factory=set)


class Sessions:
    """The agent's sessions, and which one leads each family (by its epoch)."""

    def __init__(self) -> None:
        self.by_number: dict[int, Session] = {}
        #: family -> number of the session that leads it.
        self.owner: dict[str, int] = {}
        #: family -> the newest epoch it was led at (never goes down).
        self.epochs: dict[str, int] = {}
        #: The newest epoch seen (``ping`` shows it).
        self.top = 0
        self._counter = 0
        #: Monotonic time of the last accepted call of any session.
        self.last_heard = time.monotonic()
        #: Seconds of silence after which a session's families start nothing (None: never).
        self.detach_after: float | None = None
        #: Seconds of its leader's silence after which a family's fence lapses.
        self.fence_hold = DEFAULT_FENCE_HOLD
        #: family -> when the session that led it, now gone, was last heard (monotonic).
        self._left: dict[str, float] = {}

    @property
    def opened(self) -> int:
        """How many sessions were ever opened (0: never served)."""
        return self._counter

    def open(self, master_id: str, epoch: int, families: Iterable[str]) -> Session:
        """A new session of ``master_id`` leading ``families`` at ``epoch`` (its earlier
        sessions end); :data:`FENCED` if one of them was led at a newer epoch."""
        wanted = frozenset(families)
        now = time.monotonic()
        for family in sorted(wanted):
            newer = self.epochs.get(family, 0)
            if newer > epoch and not self._lapsed(family, now):
                raise JodlError(f"{FENCED} {epoch} is older than {newer} (family {family})")
        for old in list(self.by_number.values()):
            if old.master_id == master_id:
                self._drop(old)
        self._counter += 1
        session = Session(self._counter, master_id, epoch, wanted, now)
        self.by_number[session.number] = session
        for family in wanted:
            self.epochs[family] = epoch  # lower than before only once the fence lapsed
            self.owner[family] = session.number
        self.top = max(self.epochs.values(), default=0)
        self.last_heard = now
        return session

    def _lapsed(self, family: str, now: float) -> bool:
        """Whether ``family``'s leader here has been silent for the fence hold."""
        leader = self.by_number.get(self.owner.get(family, 0))
        heard = leader.heard if leader is not None else self._left.get(family, now)
        return now - heard > self.fence_hold

    def _drop(self, session: Session) -> None:
        """Forget ``session``, remembering when the families it led last heard of it."""
        self.by_number.pop(session.number, None)
        for family in session.families:
            if self.owner.get(family) == session.number:
                self._left[family] = session.heard

    def check(self, session: Session) -> None:
        """:data:`FENCED` when another master took one of the session's families."""
        for family in session.families:
            newer = self.epochs.get(family, 0)
            if newer > session.epoch:
                raise JodlError(
                    f"{FENCED} {session.epoch} is older than {newer} (family {family} "
                    "is led by another master now)"
                )

    def hear(self, epoch: int, number: int | None, since: float) -> tuple[Session | None, bool]:
        """Accept a call (fencing, session, gap): its session (None: an unscoped caller)
        and whether the call woke it from a silence the master accounts for.

        ``number`` None for a caller that sends no session: it is fenced by the newest
        epoch only, and stands for the newest session of its epoch, if any.
        """
        if number is None:
            if epoch < self.top:
                raise JodlError(f"{FENCED} {epoch} is older than {self.top}")
            ours = [n for n, s in self.by_number.items() if s.epoch == epoch]
            if not ours:
                return None, False
            number, since = max(ours), float("inf")
        current = self.by_number.get(number)
        if current is None or current.epoch != epoch:
            raise JodlError(f"stale connection: session {number} was replaced; init again")
        self.check(current)
        now = time.monotonic()
        gap = now - current.heard - since
        limit = self.detach_after
        if limit is not None and gap > limit:
            # Frozen or cut off while the master gave up on this node: it may have run
            # our queued jobs elsewhere. Only a new init (which cancels them) helps.
            self.end(current)
            raise JodlError(
                f"detached: {gap:.1f}s without the master (more than {limit:g}s); init again"
            )
        silent = limit is not None and now - current.heard > limit
        current.heard = self.last_heard = now
        return current, silent and not current.paused

    def end(self, session: Session) -> None:
        """Close ``session`` (detached): its families start nothing until a new init."""
        self._drop(session)

    def owns(self, session: Session | None, family: str | None) -> bool:
        """Whether ``session`` leads ``family`` now (no session: an unscoped caller)."""
        return session is None or (family is not None and self.owner.get(family) == session.number)

    def sole(self, session: Session | None) -> bool:
        """Whether ``session`` leads every family anything was sent for (no filtering)."""
        return session is None or all(n == session.number for n in self.owner.values())

    def halted(self, family: str, now: float) -> bool:
        """Whether jobs of ``family`` must not start: its leader's session is gone,
        paused after init, or silent for longer than the detach time."""
        session = self.by_number.get(self.owner.get(family, 0))
        if session is None:
            return True
        if session.paused:
            return True
        limit = self.detach_after
        return limit is not None and now - session.heard > limit

    def startable(self, queue: deque[tuple[int, str, str]]) -> int | None:
        """Index of the first queued job that may start now (its family's leader has a
        live session, not paused), or None."""
        if not queue:
            return None
        now = time.monotonic()
        if not self.halted(queue[0][1], now):
            return 0
        stopped = {queue[0][1]}
        for index, job in enumerate(queue):
            if job[1] in stopped:
                continue
            if not self.halted(job[1], now):
                return index
            stopped.add(job[1])
        return None

    def leaders(self) -> tuple[tuple[str, int, str], ...]:
        """(family, epoch, master) of every family as this agent sees it, by family."""
        rows = []
        for family, epoch in sorted(self.epochs.items()):
            session = self.by_number.get(self.owner.get(family, 0))
            rows.append((family, epoch, session.master_id if session is not None else ""))
        return tuple(rows)

    def clear(self) -> None:
        """Forget every session and epoch (the agent serves another cluster now)."""
        self.by_number.clear()
        self.owner.clear()
        self.epochs.clear()
        self._left.clear()
        self.top = 0


def detach_time(setting: float | None, give_up: Any, agent: str) -> float | None:
    """Seconds of silence after which a session's jobs start nothing: ``setting``
    (``JODL_AGENT_DETACH``), else a share of the master's give-up time ``give_up``;
    refused when not shorter than it (the master would give up first)."""
    if type(give_up) not in (int, float) or give_up <= 0:
        return setting
    if setting is None:
        return float(give_up) * DETACH_SHARE
    if setting >= give_up:
        raise JodlError(
            f"agent {agent}: JODL_AGENT_DETACH ({setting:g}s) must be "
            f"shorter than the master's JODL_CALL_TIMEOUT ({give_up:g}s)"
        )
    return setting


def check_fence_hold(hold: float, lease_ttl: Any, give_up: Any, agent: str) -> None:
    """:class:`JodlError` unless the fence hold outlasts a master's lease TTL plus its
    give-up time (the longest a master that lost its lease may still call)."""
    if type(lease_ttl) not in (int, float) or type(give_up) not in (int, float):
        return
    if hold <= lease_ttl + give_up:
        raise JodlError(
            f"agent {agent}: JODL_AGENT_FENCE_HOLD ({hold:g}s) must be longer than the "
            f"master's JODL_LEASE_TTL plus JODL_CALL_TIMEOUT ({lease_ttl + give_up:g}s)"
        )


__all__ = ["Session", "Sessions", "check_fence_hold", "detach_time"]
