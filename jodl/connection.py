"""The master's side of one agent: an rpyc connection, its calls, and reconnect backoff."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Any

from .config import Settings
from .exceptions import AgentUnavailable, AuthError
from .protocol import REPLY_CHECKS, BadReply, check_info, connect

log = logging.getLogger("jodl.connection")

#: First pause before reconnecting to an unreachable agent (seconds); doubles each time.
BACKOFF_START = 0.5

# What a dead, hung or refusing peer raises: connection reset/refused, EOF, timeouts,
# and rpyc's remote exceptions (which arrive as generic exceptions under the strict config).
CALL_ERRORS: tuple[type[BaseException], ...] = (OSError, EOFError, TimeoutError, Exception)
#: Calls whose first argument is the epoch: sent as the stamp (epoch, session, since)
#: so the agent can tell a slow master from one that gave up on it (jodl.agent).
STAMPED = frozenset(("send", "done", "failed", "remaining", "take_back", "ack", "cancel", "held"))


class AgentLink:
    """One connection to one agent, used by the master's thread only.

    Any failed call closes the link and raises :class:`AgentUnavailable`; the master
    then treats the node as unreachable and retries after :meth:`retry_due` with
    exponential backoff and jitter.
    """

    def __init__(self, node_id: int, address: str, settings: Settings) -> None:
        self.node_id = node_id
        self.address = address
        self.settings = settings
        self.conn: Any = None
        self.info: dict[str, Any] = {}
        self.failures = 0
        self.next_try = 0.0
        self.last_error: str | None = None
        self._calls: dict[str, Callable[..., Any]] = {}
        #: Round trip of the last ping-like call (seconds), for balancing decisions.
        self.rtt = 0.001
        #: The agent's session for this connection (from init), None for an old agent.
        self.session: int | None = None
        #: Monotonic time of the last call sent (the agent measures gaps against it).
        self.last_call = 0.0
        #: Moving mean of all calls' round trips (seconds), for metrics.
        self.call_time = 0.001

    @property
    def connected(self) -> bool:
        return self.conn is not None

    def open(self, master_id: str, epoch: int, settings_json: str = "{}") -> dict[str, Any]:
        """Connect, authenticate and init the agent (protocol a); return its info."""
        try:
            self.conn = self._dial()
            root = self.conn.root
            self._calls = {
                name: getattr(root, name)
                for name in (
                    "init",
                    "send",
                    "done",
                    "failed",
                    "remaining",
                    "take_back",
                    "ack",
                    "cancel",
                    "held",
                    "ping",
                    "families",
                )
            }
            started = time.perf_counter()
            self.last_call = time.monotonic()
            self.info = check_info(self._calls["init"](master_id, epoch, settings_json))
            self.rtt = time.perf_counter() - started
            session = self.info.get("session")
            self.session = session if type(session) is int else None
        except BadReply as exc:
            raise self._bad_reply("init", exc) from None
        except AuthError as exc:
            self._fail(str(exc))
            raise AgentUnavailable(str(exc)) from None
        except CALL_ERRORS as exc:
            self._fail(_describe(exc))
            raise AgentUnavailable(f"{self.address}: {_describe(exc)}") from None
        self.failures = 0
        self.last_error = None
        return self.info

    def _dial(self) -> Any:
        """The connection whose ``root`` makes the calls (an in-process link overrides it)."""
        return connect(self.address, self.settings)

    def call(self, name: str, *args: Any) -> Any:
        """Call ``name`` on the agent; :class:`AgentUnavailable` on any failure.

        The reply is checked to be of the call's type and shape (``done`` and
        ``failed`` come back decoded as lists of rows): a bad one makes the node
        count as faulty, exactly like an unreachable one.
        """
        if self.conn is None:
            raise AgentUnavailable(f"{self.address}: not connected")
        now = time.monotonic()
        if self.session is not None and name in STAMPED:
            args = ((args[0], self.session, now - self.last_call), *args[1:])
        self.last_call = now
        try:
            reply = self._calls[name](*args)
        except CALL_ERRORS as exc:
            self._fail(_describe(exc))
            raise AgentUnavailable(f"{self.address}: {_describe(exc)}") from None
        self.call_time += 0.2 * (time.monotonic() - now - self.call_time)
        check = REPLY_CHECKS.get(name)
        if check is None:
            return reply
        try:
            return check(reply)
        except BadReply as exc:
            raise self._bad_reply(name, exc) from None

    def _bad_reply(self, name: str, exc: BadReply) -> AgentUnavailable:
        error = f"bad reply to {name} ({exc}): the agent is faulty"
        log.warning("node %s: %s", self.address, error)
        self._fail(error)
        return AgentUnavailable(f"{self.address}: {error}")

    def _fail(self, error: str) -> None:
        self.last_error = error
        self.failures += 1
        delay = min(self.settings.node_backoff_max, BACKOFF_START * 2 ** (self.failures - 1))
        self.next_try = time.monotonic() + delay * random.uniform(0.5, 1.0)
        self.close()

    def retry_due(self) -> bool:
        return self.conn is None and time.monotonic() >= self.next_try

    def close(self) -> None:
        conn, self.conn = self.conn, None
        self._calls = {}
        if conn is not None:
            try:
                conn.close()
            except Exception:  # noqa: BLE001 - closing a broken connection may fail again
                pass


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
