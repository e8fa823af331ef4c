"""The agent's rpyc server: the calls a master may make, checked, on an :class:`AgentCore`.

Every argument is checked to be a value type of the call's shape before the core
sees it; every reply is a value type (the hot calls' batches framed as one str,
:mod:`jodl.agent.codec`). Custom exceptions do not survive the wire: a refusal
arrives at the master as an error whose text says why (e.g.
:data:`jodl.agent.replies.FENCED`).
"""

from __future__ import annotations

import logging
import socket
import time
from functools import partial
from typing import Any

import rpyc  # type: ignore[import-untyped]

from ..exceptions import ConfigError, JodlError
from ..obs import tracing
from ..settings.config import Settings
from .auth import require_auth
from .codec import decode_ids, decode_jobs, decode_traces, encode_done, encode_failed
from .core import AgentCore, Done, Failed, FamilyRow
from .drain import Drain
from .progress import Report
from .sessions import Session
from .wire import STRICT_CONFIG, GuardedServer, is_loopback, split_address

# Arguments are checked by exact type, never converted: int() or str() of a netref
# would call back into the peer's objects, which is what the strict protocol forbids.


def _int(value: Any, what: str = "value") -> int:
    if type(value) is not int:
        raise TypeError(f"{what} must be a plain int")
    return value


def _str(value: Any, what: str = "value") -> str:
    if type(value) is not str:
        raise TypeError(f"{what} must be a plain str")
    return value


def _ids(values: Any) -> tuple[int, ...]:
    if type(values) is str:
        return decode_ids(values)
    if type(values) is not tuple or any(type(v) is not int for v in values):
        raise TypeError("ids must be a plain tuple of ints")
    return values


def _jobs(values: Any) -> list[tuple[int, str, str]]:
    if type(values) is str:
        return decode_jobs(values)
    if type(values) is not tuple:
        raise TypeError("jobs must be a plain tuple of (exec_id, family, payload_json) tuples")
    for job in values:
        if (
            type(job) is not tuple
            or len(job) != 3
            or type(job[0]) is not int
            or type(job[1]) is not str
            or type(job[2]) is not str
        ):
            raise TypeError("each job is a plain tuple (exec_id: int, family: str, payload: str)")
    return list(values)


class AgentService(rpyc.Service):
    """The calls a master may make. Arguments are checked to be value types.

    Every call but ``ping``, ``families``, ``leaders`` and ``init`` starts with a *stamp*: the
    master's epoch, or ``(epoch, session, since)`` (see the module docstring).
    """

    def __init__(self, core: AgentCore) -> None:
        super().__init__()
        self._core = core
        self.drain = Drain(core)

    def _heard(self, stamp: Any) -> tuple[Session | None, bool]:
        if type(stamp) is int:
            return self._core.hear(stamp, None, 0.0)
        if (
            type(stamp) is not tuple
            or len(stamp) != 3
            or type(stamp[0]) is not int
            or type(stamp[1]) is not int
            or type(stamp[2]) not in (int, float)
        ):
            raise TypeError("the stamp is an epoch or a plain tuple (epoch, session, since)")
        return self._core.hear(stamp[0], stamp[1], max(0.0, float(stamp[2])))

    def _call(
        self, stamp: Any, fn: Any, *args: Any, scoped: bool = False, once: bool = False
    ) -> Any:
        """``fn(*args)`` for the stamp's session (``scoped``: passed as ``session``;
        ``once``: outcomes, each handed once to a session the stamp names, see
        :attr:`Session.handed`, and to an unnamed caller every time)."""
        session, resume = self._heard(stamp)
        try:
            if once:
                handed = session.handed if session is not None and type(stamp) is tuple else None
                return fn(*args, session=session, handed=handed)
            return fn(*args, session=session) if scoped else fn(*args)
        finally:
            if resume:  # after the call: what it cancels must not start in between
                self._core.resume(session)

    def exposed_ping(self) -> tuple[str, int, float]:
        return (self._core.name, self._core.epoch, time.time())

    def exposed_families(self) -> tuple[FamilyRow, ...]:
        return self._core.family_list()

    def exposed_leaders(self) -> tuple[tuple[str, int, str], ...]:
        """(family, epoch, master) of each family as this agent sees its leaders."""
        return self._core.leaders()

    def exposed_init(self, master_id: str, epoch: int, settings_json: str) -> str:
        return self._core.init(
            _str(master_id, "master id"), _int(epoch, "epoch"), _str(settings_json, "settings")
        )

    def exposed_send(
        self, epoch: Any, jobs: tuple, traces: str = ""
    ) -> tuple[tuple[int, str], ...]:
        """Queue ``jobs``; ``traces`` (framed, optional): their trace contexts, sent by a
        master with traces on to an agent whose ``init`` said it has them on."""
        text = _str(traces, "traces")  # checked first: a netref is never even tested
        carried = decode_traces(text) if text else None
        return self._call(epoch, partial(self._core.send, traces=carried), _jobs(jobs), scoped=True)

    def exposed_done(
        self, epoch: Any, ack: tuple | str, limit: int, framed: bool = False
    ) -> tuple[Done, ...] | str:
        """Held results (acknowledging ``ack`` first); one framed str when ``framed``."""
        rows = self._call(
            epoch, self._core.take, "done", _ids(ack), _int(limit, "limit"), once=True
        )
        return encode_done(rows) if framed is True else rows

    def exposed_failed(
        self, epoch: Any, ack: tuple | str, limit: int, framed: bool = False
    ) -> tuple[Failed, ...] | str:
        rows = self._call(
            epoch, self._core.take, "failed", _ids(ack), _int(limit, "limit"), once=True
        )
        return encode_failed(rows) if framed is True else rows

    def exposed_outcomes(self, epoch: Any, ack: tuple | str, limit: int) -> tuple[str, str]:
        """``done`` and ``failed`` in one round trip: (framed results, framed failures),
        up to ``limit`` of each, acknowledging ``ack`` first."""
        done, failed = self._call(
            epoch, self._core.take_outcomes, _ids(ack), _int(limit, "limit"), once=True
        )
        return encode_done(done), encode_failed(failed)

    def exposed_exchange(
        self, epoch: Any, jobs: tuple, ack: tuple | str, limit: int, traces: str = ""
    ) -> tuple[tuple[tuple[int, str], ...], str, str]:
        """``send``, then ``outcomes``, in one round trip: (refused, framed results,
        framed failures)."""
        text = _str(traces, "traces")  # checked first: a netref is never even tested
        carried = decode_traces(text) if text else None
        refused, done, failed = self._call(
            epoch,
            partial(self._core.exchange, traces=carried),
            _jobs(jobs),
            _ids(ack),
            _int(limit, "limit"),
            once=True,
        )
        return refused, encode_done(done), encode_failed(failed)

    def exposed_ack(self, epoch: Any, ids: tuple) -> int:
        return self._call(epoch, self._core.ack, _ids(ids))

    def exposed_remaining(self, epoch: Any) -> tuple[int, int, int, int]:
        return self._call(epoch, self._core.remaining)

    def exposed_progress(self, epoch: Any) -> tuple[Report, ...]:
        """The running jobs' newest progress reports (``jodl.progress``)."""
        return self._call(epoch, self._core.progress)

    def exposed_take_back(self, epoch: Any, count: int, ids: tuple) -> tuple[int, ...]:
        return self._call(epoch, self._core.take_back, _int(count, "count"), _ids(ids), scoped=True)

    def exposed_cancel(self, epoch: Any, ids: tuple) -> tuple[int, ...]:
        return self._call(epoch, self._core.cancel, _ids(ids), scoped=True)

    def exposed_held(self, epoch: Any, ids: tuple) -> tuple[int, ...]:
        return self._call(epoch, self._core.held, _ids(ids))

    def exposed_reload(self, epoch: Any, now: bool) -> int:
        """The generation of the families served (``now``: reload them first)."""
        if type(now) is not bool:
            raise TypeError("now must be a plain bool")
        if now:
            return self._call(epoch, self._core.reload, "asked by the master")
        return self._call(epoch, lambda: self._core.installed.generation)

    def exposed_draining(self, epoch: Any, start: bool) -> bool:
        """Whether the agent drains (``start``: the master asks it to)."""
        if type(start) is not bool:
            raise TypeError("start must be a plain bool")
        return self._call(epoch, self.drain.answer, start)


class AgentServer(GuardedServer):
    """The agent's rpyc server (authenticated, see :class:`GuardedServer`) and its core."""

    def __init__(self, core: AgentCore, settings: Settings, **kwargs: Any) -> None:
        service = AgentService(core)
        super().__init__(service, settings, **kwargs)
        self.core = core
        #: SIGTERM starts it; the agent exits once drained (see :mod:`jodl.agent.drain`).
        self.drain = service.drain


def make_server(
    settings: Settings, listen: str | None = None, name: str | None = None
) -> AgentServer:
    """Build (not start) the agent's server; refuses to start without a secret or TLS,
    or when an installed family's settings are wrong (:meth:`Installed.prepare`).

    Loopback is no exception: any local user could otherwise command the agent, and
    one who binds its port first would receive the master's jobs.
    """
    address = listen or settings.agent_listen
    host, port = split_address(address)
    require_auth(settings, f"refusing to listen on {address}", agent=True)
    if settings.secret and not settings.node_key:
        # Single-host mode: this agent could command every other agent of the cluster.
        logging.getLogger("jodl.agent").log(
            logging.INFO if is_loopback(host) else logging.WARNING,
            "agent %s holds the cluster secret JODL_SECRET (single-host mode): whoever takes "
            "this host can command every agent. Give it its own key instead: "
            "JODL_NODE_KEY=$(jodl node key ADDRESS) on a master host",
            address,
        )
    tracing.configure(settings.traces)
    core = AgentCore(
        name or f"{socket.gethostname()}:{port}",
        slots=settings.agent_slots,
        async_slots=settings.agent_async_slots,
        loop=settings.agent_loop,
        speed=settings.agent_speed,
        detach=settings.agent_detach,
        fence_hold=settings.agent_fence_hold,
    )
    try:
        core.installed.prepare()  # a family's bad settings stop the agent here
    except ConfigError:
        core.close()
        raise
    try:
        server = AgentServer(
            core,
            settings,
            hostname=host,
            ipv6=":" in host,  # e.g. [::1]:PORT
            port=port,
            reuse_addr=True,
            protocol_config=dict(STRICT_CONFIG),
            logger=logging.getLogger("jodl.agent.rpyc"),
        )
    except OSError as exc:
        core.close()
        raise JodlError(f"cannot listen on {address}: {exc.strerror or exc}") from None
    return server
