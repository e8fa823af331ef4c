"""One-shot self-registration: an agent says hello to the master once, then is polled.

The master (``JODL_REGISTER_LISTEN=HOST:PORT``) serves a tiny rpyc service with a
single call, ``hello(address, slots, labels_json)``, behind the same
authentication as the agents (shared secret or mutual TLS). It only records the
node in the log; the master's loop picks it up on its next node refresh. Agents
never call the master otherwise.
"""

from __future__ import annotations

import json
import logging
import threading
import time

import rpyc
from rpyc.utils.server import ThreadedServer

from .agent.auth import require_auth
from .agent.wire import STRICT_CONFIG, GuardedServer, connect, split_address
from .config import Settings
from .exceptions import AgentUnavailable, AuthError, JodlError
from .log.store import Store

log = logging.getLogger("jodl.registry")


class HelloService(rpyc.Service):
    """The master's only inbound call."""

    def __init__(self, store: Store) -> None:
        super().__init__()
        self._store = store

    def exposed_hello(self, address: str, slots: int, labels_json: str) -> int:
        # Exact types, never str()/int() of what the peer sent: those would call back
        # into a netref (the peer's own object).
        if type(address) is not str or len(address) > 300:
            raise TypeError("address must be a plain str HOST:PORT")
        split_address(address)  # refuse anything but HOST:PORT
        if type(slots) is not int or not 1 <= slots <= 100_000:
            raise TypeError("slots must be a plain int from 1 to 100000")
        if type(labels_json) is not str or len(labels_json) > 10_000:
            raise TypeError("labels must be a plain str of JSON")
        labels = json.loads(labels_json or "{}")
        if not isinstance(labels, dict) or not all(
            type(k) is str and type(v) is str for k, v in labels.items()
        ):
            raise ValueError("labels must be a JSON object of strings")
        node = self._store.add_node(address, slots=slots, labels=labels)
        log.info("node %s said hello (%d slots)", address, slots)
        return int(node.id)


def serve_hello(settings: Settings, store: Store, listen: str) -> ThreadedServer:
    """Start the hello service in a daemon thread; return the server (``close()`` stops it)."""
    host, port = split_address(listen)
    require_auth(settings, f"refusing to accept hellos on {listen}")
    server = GuardedServer(
        HelloService(store),
        settings,
        hostname=host,
        port=port,
        reuse_addr=True,
        protocol_config=dict(STRICT_CONFIG),
        logger=logging.getLogger("jodl.registry.rpyc"),
    )
    threading.Thread(target=server.start, name="hello", daemon=True).start()
    deadline = time.monotonic() + 5.0
    while not server.active and time.monotonic() < deadline:  # listening before we return
        time.sleep(0.005)
    return server


def hello(
    master: str, address: str, slots: int, settings: Settings, labels: dict[str, str] | None = None
) -> int:
    """Announce the agent at ``address`` to the master's hello service; return the node id."""
    try:
        conn = connect(master, settings)
    except (OSError, AuthError) as exc:
        raise AgentUnavailable(f"cannot say hello to the master at {master}: {exc}") from None
    try:
        node_id = conn.root.hello(address, slots, json.dumps(labels or {}))
        if type(node_id) is not int:
            raise JodlError(f"the master at {master} answered the hello with a non-int")
        return node_id
    except JodlError:
        raise
    except Exception as exc:  # noqa: BLE001 - remote errors arrive as generic exceptions
        raise JodlError(f"the master at {master} refused the hello: {exc}") from None
    finally:
        conn.close()
