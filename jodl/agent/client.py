"""The master's client of one agent: one typed method per call of the protocol.

A call is sent through layers of one concern each (outermost first):

1. the typed method (:meth:`AgentLink.send`, :meth:`AgentLink.done`, ...): encodes
   its arguments for the wire (:mod:`jodl.agent.codec`) and names the reply's check;
2. :meth:`AgentLink._stamped`: the calls after ``init`` carry the stamp
   ``(epoch, session, since)``, so the agent can tell a slow master from one that
   gave up on it (:mod:`jodl.agent.core`);
3. :meth:`AgentLink._request`: sends, times the round trip, turns any failure into
   :class:`~jodl.exceptions.AgentUnavailable` (:class:`~jodl.exceptions.Fenced` when
   the agent refuses our epoch), closes the link and backs off; then checks the
   reply (:mod:`jodl.agent.replies`): a bad one makes the node count as faulty,
   exactly like an unreachable one;
4. :meth:`AgentLink._dial`: the connection, rpyc over the authenticated wire
   (:mod:`jodl.agent.wire`), or the in-process agent (:mod:`jodl.agent.local`).

The names of the calls appear here (and as the server's ``exposed_`` methods) only.
"""

from __future__ import annotations

import logging
import os
import random
import re
import socket
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from ..exceptions import AgentUnavailable, AuthError, Fenced
from ..settings.config import Settings
from .codec import encode_ids, encode_jobs
from .keys import FIRST_KEYS, KeyRange
from .replies import (
    FENCED,
    AgentFamily,
    AgentInfo,
    BadReply,
    DoneRow,
    FailedRow,
    Leader,
    Ping,
    ProgressReport,
    Refused,
    Remaining,
    check_count,
    check_done,
    check_exchange,
    check_failed,
    check_families,
    check_flag,
    check_ids,
    check_info,
    check_leaders,
    check_outcomes,
    check_ping,
    check_progress,
    check_refused,
    check_remaining,
)
from .wire import connect

log = logging.getLogger("jodl.agent.client")

#: The epoch an agent's refusal names as newer than ours.
_NEWER = re.compile(r"is older than (\d+)")
#: First pause before reconnecting to an unreachable agent (seconds); doubles each time.
BACKOFF_START = 0.5

# What a dead, hung or refusing peer raises: connection reset/refused, EOF, timeouts,
# and rpyc's remote exceptions (which arrive as generic exceptions under the strict config).
CALL_ERRORS: tuple[type[BaseException], ...] = (OSError, EOFError, TimeoutError, Exception)

#: The calls an agent serves (``AgentService.exposed_<name>``).
CALLS = (
    "init",
    "send",
    "done",
    "failed",
    "outcomes",
    "exchange",
    "remaining",
    "progress",
    "take_back",
    "ack",
    "cancel",
    "held",
    "draining",
    "reload",
    "ping",
    "families",
    "leaders",
)

#: A job as sent: (execution id, family name, payload JSON).
WireJob = tuple[int, str, str]
_Reply = TypeVar("_Reply")


class AgentLink:
    """One connection to one agent, used by the master's thread only.

    Any failed call closes the link and raises :class:`AgentUnavailable`; the master
    then treats the node as unreachable and retries after :meth:`retry_due` with
    exponential backoff and jitter.
    """

    def __init__(
        self,
        node_id: int,
        address: str,
        settings: Settings,
        issued: Callable[[], int] | None = None,
    ) -> None:
        self.node_id = node_id
        self.address = address
        self.settings = settings
        #: The newest epoch the database issued (to tell a forged fence from a real one).
        self.issued = issued
        self.conn: Any = None
        #: What the agent said at the last ``init`` (None before the first).
        self.info: AgentInfo | None = None
        self.failures = 0
        #: Its last failure was a reply of the wrong shape: it answers, but wrongly.
        self.faulty = False
        self.next_try = 0.0
        self.last_error: str | None = None
        self._calls: dict[str, Callable[..., Any]] = {}
        #: Round trip of the last ping-like call (seconds), for balancing decisions.
        self.rtt = 0.001
        #: The agent's session for this connection (from init).
        self.session: int | None = None
        #: Monotonic time of the last call sent (the agent measures gaps against it).
        self.last_call = 0.0
        #: Moving mean of all calls' round trips (seconds), for metrics.
        self.call_time = 0.001
        #: Monotonic time of the last call the agent answered well (0.0: none yet), for
        #: the node's "last seen" in the log (:class:`jodl.master.seen.LastSeen`).
        self.answered = 0.0
        #: The generations of the node's key this master accepts (the log's), and those
        #: it accepted when the open connection was made.
        self.key_range: KeyRange = FIRST_KEYS
        self.dialled_range: KeyRange = FIRST_KEYS

    @property
    def connected(self) -> bool:
        return self.conn is not None

    # -- the calls ------------------------------------------------------------------------

    def open(self, master_id: str, epoch: int, settings_json: str = "{}") -> AgentInfo:
        """Connect, authenticate and :meth:`init` the agent; return its info."""
        try:
            self.conn = self._dial()
            root = self.conn.root
            self._calls = {name: getattr(root, name) for name in CALLS}
        except AuthError as exc:
            self._fail(str(exc))
            raise AgentUnavailable(str(exc)) from None
        except CALL_ERRORS as exc:
            raise self._call_failed(exc) from None
        info = self.init(master_id, epoch, settings_json)
        self.failures = 0
        self.last_error = None
        return info

    def init(self, master_id: str, epoch: int, settings_json: str = "{}") -> AgentInfo:
        """Serve this master (a new session; the agent pauses until the next call)."""
        started = time.perf_counter()
        self.info = info = self._request("init", check_info, (master_id, epoch, settings_json))
        self.rtt = time.perf_counter() - started
        self.session = info.session
        return info

    def send(self, epoch: int, jobs: Iterable[WireJob], traces: str = "") -> tuple[Refused, ...]:
        """Queue jobs on the agent; the ones it refused. ``traces``: their trace contexts
        (:func:`~jodl.agent.codec.encode_traces`), only to an agent that reads them."""
        if traces:
            return self._stamped("send", check_refused, epoch, encode_jobs(jobs), traces)
        return self._stamped("send", check_refused, epoch, encode_jobs(jobs))

    def done(self, epoch: int, ack: Iterable[int], limit: int) -> list[DoneRow]:
        """Acknowledge ``ack`` (committed), then take up to ``limit`` results held there."""
        return self._stamped("done", check_done, epoch, encode_ids(ack), limit, True)

    def failed(self, epoch: int, ack: Iterable[int], limit: int) -> list[FailedRow]:
        """As :meth:`done`, for the failures held there."""
        return self._stamped("failed", check_failed, epoch, encode_ids(ack), limit, True)

    def outcomes(
        self, epoch: int, ack: Iterable[int], limit: int
    ) -> tuple[list[DoneRow], list[FailedRow]]:
        """:meth:`done` and :meth:`failed` in one round trip: up to ``limit`` of each."""
        return self._stamped("outcomes", check_outcomes, epoch, encode_ids(ack), limit)

    def exchange(
        self, epoch: int, jobs: Iterable[WireJob], ack: Iterable[int], limit: int, traces: str = ""
    ) -> tuple[tuple[Refused, ...], list[DoneRow], list[FailedRow]]:
        """:meth:`send`, then :meth:`outcomes`, in one round trip: (refused, results,
        failures)."""
        return self._stamped(
            "exchange", check_exchange, epoch, encode_jobs(jobs), encode_ids(ack), limit, traces
        )

    def ack(self, epoch: int, ids: Iterable[int]) -> int:
        """Let the agent forget results the master committed; how many it held."""
        return self._stamped("ack", check_count, epoch, encode_ids(ids))

    def remaining(self, epoch: int) -> Remaining:
        """What the agent queues, runs and holds."""
        return self._stamped("remaining", check_remaining, epoch)

    def take_back(self, epoch: int, count: int, ids: Iterable[int] = ()) -> tuple[int, ...]:
        """Hand back unstarted jobs (``ids``, or else the last ``count`` queued)."""
        return self._stamped("take_back", check_ids, epoch, count, encode_ids(ids))

    def cancel(self, epoch: int, ids: Iterable[int]) -> tuple[int, ...]:
        """Drop queued jobs and discard the results of running ones; the ids cancelled."""
        return self._stamped("cancel", check_ids, epoch, encode_ids(ids))

    def held(self, epoch: int, ids: Iterable[int]) -> tuple[int, ...]:
        """Which of ``ids`` the agent still queues, runs or holds a result for."""
        return self._stamped("held", check_ids, epoch, encode_ids(ids))

    def draining(self, epoch: int, start: bool = False) -> bool:
        """Whether the agent drains (then it gets nothing new); ``start`` asks it to."""
        return self._stamped("draining", check_flag, epoch, start)

    def reload(self, epoch: int, now: bool = False) -> int:
        """The generation of the agent's families (another one than at ``init``: they
        changed); ``now`` asks it to reload them first."""
        return self._stamped("reload", check_count, epoch, now)

    def progress(self, epoch: int) -> tuple[ProgressReport, ...]:
        """The running jobs' newest progress reports."""
        return self._stamped("progress", check_progress, epoch)

    def ping(self) -> Ping:
        """The agent's name, epoch and clock (no stamp: any master may ask)."""
        return self._request("ping", check_ping, ())

    def families(self) -> tuple[AgentFamily, ...]:
        """The families installed on the agent, with version and flags."""
        return self._request("families", check_families, ())

    def leaders(self) -> tuple[Leader, ...]:
        """Each family's leader as the agent sees it (no stamp: any master may ask)."""
        return self._request("leaders", check_leaders, ())

    # -- the layers -----------------------------------------------------------------------

    def _stamped(self, name: str, check: Callable[[Any], _Reply], epoch: int, *args: Any) -> _Reply:
        """``name`` with the stamp (epoch, session, time since the previous call) first."""
        now = time.monotonic()
        stamp = epoch if self.session is None else (epoch, self.session, now - self.last_call)
        return self._request(name, check, (stamp, *args), now)

    def _request(
        self,
        name: str,
        check: Callable[[Any], _Reply],
        args: tuple[Any, ...],
        now: float | None = None,
    ) -> _Reply:
        """Call ``name`` and check its reply; :class:`AgentUnavailable` on any failure."""
        if self.conn is None:
            raise AgentUnavailable(f"{self.address}: not connected")
        if now is None:
            now = time.monotonic()
        self.last_call = now
        try:
            reply = self._calls[name](*args)
        except CALL_ERRORS as exc:
            raise self._call_failed(exc) from None
        self.call_time += 0.2 * (time.monotonic() - now - self.call_time)
        try:
            checked = check(reply)
        except BadReply as exc:
            raise self._bad_reply(name, exc) from None
        self.answered = now
        return checked

    def _dial(self) -> Any:
        """The connection whose ``root`` makes the calls (an in-process link overrides it)."""
        self.dialled_range = self.key_range
        return connect(self.address, self.settings, generations=self.key_range)

    def rekeyed(self, key_range: KeyRange) -> bool:
        """The log accepts the node's key generations ``key_range`` now; True when the
        open connection may rest on a key no longer accepted (the caller opens a new
        one, which the agent must prove under an accepted key)."""
        self.key_range = key_range
        old_oldest, old_newest = self.dialled_range
        oldest, newest = key_range
        return self.connected and not (oldest <= old_oldest and old_newest <= newest)

    # -- failures -------------------------------------------------------------------------

    def _call_failed(self, exc: BaseException) -> AgentUnavailable:
        error = _describe(exc)
        self._fail(error)
        if FENCED in error:  # the agent serves a master of a newer epoch now
            forged = self._forged(error)
            if forged is not None:
                return AgentUnavailable(forged)
            return Fenced(f"a newer master has taken over ({self.address}: {error})")
        return AgentUnavailable(f"{self.address}: {error}")

    def _forged(self, error: str) -> str | None:
        """Why the agent's fence is not one the database issued; None if it may be.

        An epoch newer than any the database drew was made up by a holder of the
        secret or of this node's key: no master holds it, so it stops no master; the
        node is unusable until its fence lapses (docs/architecture.md, "Forged epochs").
        """
        found = _NEWER.search(error)
        if found is None or self.issued is None:
            return None
        try:
            issued = self.issued()
        except Exception:  # noqa: BLE001 - cannot tell: take the fence for real
            return None
        newer = int(found.group(1))
        if newer <= issued:
            return None
        self.last_error = (
            f"{self.address}: fenced at epoch {newer}, which the database never issued "
            f"(newest {issued}): a forged init by a holder of the secret or of this node's "
            "key; unusable until that fence lapses (the agent's JODL_AGENT_FENCE_HOLD) or "
            "the agent restarts: rotate the credentials"
        )
        log.error("node %s: %s", self.address, self.last_error)
        return self.last_error

    def _bad_reply(self, name: str, exc: BadReply) -> AgentUnavailable:
        error = f"bad reply to {name} ({exc}): the agent is faulty"
        log.warning("node %s: %s", self.address, error)
        self._fail(error)
        self.faulty = True
        return AgentUnavailable(f"{self.address}: {error}")

    def _fail(self, error: str) -> None:
        self.last_error = error
        self.failures += 1
        delay = min(self.settings.node_backoff_max, BACKOFF_START * 2 ** (self.failures - 1))
        self.next_try = time.monotonic() + delay * random.uniform(0.5, 1.0)
        self.close(abort=True)

    def retry_due(self) -> bool:
        return self.conn is None and time.monotonic() >= self.next_try

    def close(self, abort: bool = False) -> None:
        """Close the connection; ``abort`` (after a failed call): at once.

        rpyc's ``close`` asks the peer to close too and waits for its answer up to
        the call timeout: a hung agent would cost a second timeout. Aborting shuts
        the socket down first, so that request fails at once.
        """
        conn, self.conn = self.conn, None
        self._calls = {}
        if conn is not None:
            if abort:
                _shut_down(conn)
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection may fail again
                pass


def _shut_down(conn: Any) -> None:
    """Shut the connection's socket down (reads and writes fail at once from now on)."""
    try:
        fileno = conn.fileno()
        if isinstance(fileno, int) and fileno >= 0:
            with socket.socket(fileno=os.dup(fileno)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
    except Exception:  # noqa: BLE001 - an in-process link has no socket; a dead one is shut
        pass


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
