"""In-process agents: the agent core called without rpyc (one-process mode).

A node whose address starts with ``local:`` (``local:1``) is an agent that lives in
the master's own process: :func:`start_agent` creates its :class:`AgentCore`
(job slots, and the event loop thread for async families, as in ``jodl agent``),
and the master's link to it is a :class:`LocalLink`. The link is an
:class:`~jodl.agent.client.AgentLink` with the same typed calls, stamps, reply
checks, failures and backoff; only the connection differs: its calls go to the same
:class:`AgentService` methods an rpyc agent serves, so arguments and stamps are
checked exactly as over the wire, and only wire values (scalars and plain tuples,
:func:`jodl.agent.codec.check_value`) pass in either direction.

No network is involved, hence no secret or TLS. A ``local:`` node is served only
by the process that started its agent: any other master finds it unreachable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ..settings.config import Settings
from .client import CALLS, AgentLink
from .codec import check_value
from .core import AgentCore
from .server import AgentService

#: Address prefix of in-process agents' nodes.
LOCAL_PREFIX = "local:"
#: Address of the agent ``jodl up --standalone`` starts.
DEFAULT_ADDRESS = "local:1"

_lock = threading.Lock()
#: address -> the in-process agent serving it in this process.
_agents: dict[str, InProcessAgent] = {}


def is_local(address: str) -> bool:
    """True for the address of an in-process agent's node (``local:N``)."""
    return address.startswith(LOCAL_PREFIX)


class InProcessAgent:
    """An agent core and its service, in this process, registered under ``address``."""

    def __init__(self, address: str, core: AgentCore) -> None:
        self.address = address
        self.core = core
        self.service = AgentService(core)

    def close(self) -> None:
        """Stop its slots and event loop; forget it (its node becomes unreachable)."""
        with _lock:
            if _agents.get(self.address) is self:
                del _agents[self.address]
        self.core.close()


def start_agent(settings: Settings, address: str = DEFAULT_ADDRESS) -> InProcessAgent:
    """Start the in-process agent for ``address`` with the ``JODL_AGENT_*`` settings.

    Returns the running one when this process already serves ``address``.
    """
    if not is_local(address):
        raise ValueError(f"an in-process agent's address starts with {LOCAL_PREFIX!r}")
    with _lock:
        agent = _agents.get(address)
        if agent is None:
            core = AgentCore(
                address,
                slots=settings.agent_slots,
                async_slots=settings.agent_async_slots,
                loop=settings.agent_loop,
                speed=settings.agent_speed,
                detach=settings.agent_detach,
                fence_hold=settings.agent_fence_hold,
            )
            agent = _agents[address] = InProcessAgent(address, core)
        return agent


def running_agent(address: str) -> InProcessAgent | None:
    """The in-process agent serving ``address`` here, or None."""
    with _lock:
        return _agents.get(address)


def _wire(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` taking and returning wire values only, as an rpyc call would."""

    def call(*args: Any) -> Any:
        for arg in args:
            check_value(arg)
        return check_value(fn(*args))

    return call


class _Root:
    """What ``conn.root`` is over rpyc: the service's exposed calls, by their short names."""

    def __init__(self, service: AgentService) -> None:
        self._service = service

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if name not in CALLS:
            raise AttributeError(name)
        return _wire(getattr(self._service, f"exposed_{name}"))


class _Connection:
    def __init__(self, service: AgentService) -> None:
        self.root = _Root(service)

    def close(self) -> None:
        """Nothing to close: the agent lives on with this process (it keeps its results)."""


class LocalLink(AgentLink):
    """The master's link to an in-process agent (see the module docstring)."""

    def _dial(self) -> Any:
        agent = running_agent(self.address)
        if agent is None:
            # An OSError, as a refused connection: the node counts as unreachable.
            raise ConnectionRefusedError(f"no in-process agent {self.address} in this process")
        return _Connection(agent.service)


def make_link(
    node_id: int, address: str, settings: Settings, issued: Callable[[], int] | None = None
) -> AgentLink:
    """The master's link to the node at ``address``: in-process for ``local:``, else rpyc.
    ``issued``: the newest epoch the database issued (see :meth:`AgentLink._forged`)."""
    if is_local(address):
        return LocalLink(node_id, address, settings, issued)
    return AgentLink(node_id, address, settings, issued)


__all__ = [
    "DEFAULT_ADDRESS",
    "InProcessAgent",
    "LocalLink",
    "is_local",
    "make_link",
    "running_agent",
    "start_agent",
]
