"""The agent and the master's client of it: server, wire, codec, replies, client, in-process link.

Modules, one concern each (the dependency runs down the list, never up):

* :mod:`~jodl.agent.codec` - what may cross the wire (value types only) and the
  framed batches of the hot calls;
* :mod:`~jodl.agent.replies` - the replies as named records, and their checks;
* :mod:`~jodl.agent.auth` - the handshake: shared-secret HMAC, mutual TLS;
* :mod:`~jodl.agent.admission` - which connections may start the handshake
  (a cap, a share per address, room kept for masters);
* :mod:`~jodl.agent.wire` - rpyc's strict configuration, authenticated frames,
  the guarded server and :func:`~jodl.agent.wire.connect`;
* :mod:`~jodl.agent.eventloop`, :mod:`~jodl.agent.core` - the agent's state and
  job slots (no rpyc); :mod:`~jodl.agent.server` - the rpyc service over a core;
* :mod:`~jodl.agent.client` - :class:`AgentLink`, a typed method per call;
* :mod:`~jodl.agent.local` - in-process agents (``local:`` nodes) and their link.

Calls of the protocol (the agent's ``exposed_<name>``; the client's method of the
same name). "stamp" is the master's epoch, or ``(epoch, session, since)`` after
``init``:

=============  ==================================================================
``init``       master id, epoch, settings JSON -> agent info JSON (:class:`AgentInfo`)
``send``       stamp, jobs (exec_id, family, payload_json)[, trace contexts] -> refused
``done``       stamp, ack ids, limit -> (exec_id, duration, finished, result_json) rows
``failed``     stamp, ack ids, limit -> (exec_id, duration, finished, error, retryable)
``outcomes``   stamp, ack ids, limit -> (``done`` rows, ``failed`` rows): both in one call
``exchange``   stamp, jobs, ack ids, limit[, trace contexts] -> (refused, ``done`` rows,
               ``failed`` rows): ``send`` then ``outcomes`` in one call
``remaining``  stamp -> (queued, running, held_done, held_failed)
``progress``   stamp -> (exec_id, done, total, note, unix time) per running job that reported
``take_back``  stamp, count, ids -> exec ids handed back unstarted
``ack``        stamp, ids -> number forgotten (results the master committed)
``cancel``     stamp, ids -> ids cancelled
``held``       stamp, ids -> subset of ids the agent still knows (after a master restart)
``draining``   stamp, start -> whether the agent drains (``start``: the master asks it to)
``reload``     stamp, now -> generation of its families (``now``: reload them first)
``ping``       -> (agent name, epoch, unix time)
``families``   -> ((name, version, is_async, idempotent), ...)
=============  ==================================================================

The batches of ``send``, ``done``, ``failed``, ``outcomes``, ``exchange`` and the id lists
travel framed as one str each (:mod:`~jodl.agent.codec`); the agent accepts plain tuples too.
Stamps, sessions, detaching and fencing: docs/architecture.md#the-agent-protocol.

Public: the names in ``__all__`` below (docs/architecture.md#parts-and-layering); the modules
listed above are internal, import from ``jodl.agent``.
"""

from .client import AgentLink
from .core import AgentCore
from .eventloop import loop_name, new_event_loop
from .keys import node_key
from .local import DEFAULT_ADDRESS, InProcessAgent, LocalLink, is_local, make_link, start_agent
from .replies import (
    AgentFamily,
    AgentInfo,
    BadReply,
    DoneRow,
    FailedRow,
    Ping,
    Refused,
    Remaining,
)
from .server import AgentServer, AgentService, make_server
from .wire import split_address

__all__ = [
    "DEFAULT_ADDRESS",
    "AgentCore",
    "AgentFamily",
    "AgentInfo",
    "AgentLink",
    "AgentServer",
    "AgentService",
    "BadReply",
    "DoneRow",
    "FailedRow",
    "InProcessAgent",
    "LocalLink",
    "Ping",
    "Refused",
    "Remaining",
    "is_local",
    "loop_name",
    "make_link",
    "make_server",
    "node_key",
    "new_event_loop",
    "split_address",
    "start_agent",
]
