"""Self-registration: an agent says hello to its masters, then is polled.

A master (``JODL_REGISTER_LISTEN=HOST:PORT``) serves a tiny rpyc service with a
single call, ``hello(address, slots, labels_json)``, behind its own handshake
(:func:`jodl.agent.auth.hello_authenticator`): the agent proves the key of the
address it says hello for (or shows a certificate naming it), so it registers
itself and no other node, and needs no master's credential. It only records the
node in the log with the slots and labels the agent says it has; the master's
loop picks it up on its next node refresh (and retries at once a node it had
given up on). Agents never call the master otherwise.

The agent's side is the :class:`Greeter`: it says hello to every configured master
address when it starts and again whenever it is *detached* (not polled for the
detach time), with exponential backoff and jitter capped at
``JODL_AGENT_HELLO_BACKOFF_MAX``, until a master polls it (docs/architecture.md,
"Detached agents").
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import rpyc
from rpyc.utils.server import ThreadedServer

from ..exceptions import AgentUnavailable, AuthError, JodlError
from ..log.store import Store
from ..settings.config import Settings
from .auth import hello_authenticator, require_auth
from .core import AgentCore
from .wire import STRICT_CONFIG, GuardedServer, hello_connect, split_address

log = logging.getLogger("jodl.agent.registry")


class HelloService(rpyc.Service):
    """The master's only inbound call, for one agent authenticated as ``address``."""

    def __init__(self, store: Store, address: str) -> None:
        super().__init__()
        self._store = store
        self._address = address

    def exposed_hello(self, address: str, slots: int, labels_json: str) -> int:
        # Exact types, never str()/int() of what the peer sent: those would call back
        # into a netref (the peer's own object).
        if type(address) is not str or len(address) > 300:
            raise TypeError("address must be a plain str HOST:PORT")
        split_address(address)  # refuse anything but HOST:PORT
        if address != self._address:
            raise ValueError(f"hello for {address} from an agent that proved it is {self._address}")
        if type(slots) is not int or not 1 <= slots <= 100_000:
            raise TypeError("slots must be a plain int from 1 to 100000")
        if type(labels_json) is not str or len(labels_json) > 10_000:
            raise TypeError("labels must be a plain str of JSON")
        labels = json.loads(labels_json or "{}")
        if not isinstance(labels, dict) or not all(
            type(k) is str and type(v) is str for k, v in labels.items()
        ):
            raise ValueError("labels must be a JSON object of strings")
        node = self._store.greet_node(address, slots, labels)
        log.info("node %s said hello (%d slots)", address, slots)
        return int(node.id)


class HelloServer(GuardedServer):
    """The registration port: a :class:`HelloService` per agent, for the address it proved."""

    def __init__(self, store: Store, settings: Settings, **kwargs: Any) -> None:
        # A hello is rare: the node's accepted key generations are read from the log each time.
        authenticate = hello_authenticator(settings, store.node_key_range)
        super().__init__(None, settings, authenticate, **kwargs)
        self.store = store

    def service_for(self, credentials: dict[str, Any]) -> HelloService:
        return HelloService(self.store, credentials["address"])


def serve_hello(settings: Settings, store: Store, listen: str) -> ThreadedServer:
    """Start the hello service in a daemon thread; return the server (``close()`` stops it)."""
    host, port = split_address(listen)
    require_auth(settings, f"refusing to accept hellos on {listen}")
    server = HelloServer(
        store,
        settings,
        hostname=host,
        port=port,
        reuse_addr=True,
        protocol_config=dict(STRICT_CONFIG),
        logger=logging.getLogger("jodl.agent.registry.rpyc"),
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
        conn = hello_connect(master, address, settings)
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


#: First pause between two rounds of hellos of a detached agent (seconds); it doubles
#: each round up to JODL_AGENT_HELLO_BACKOFF_MAX. Short: a master that just started
#: (or took over) should hear from its agents within about a second.
HELLO_BACKOFF_START = 0.5
#: Seconds between two looks at whether the agent is detached (while it is polled).
HELLO_CHECK = 0.2


def hello_pauses(cap: float, rng: random.Random | None = None) -> Iterator[float]:
    """The pauses between rounds of hellos: doubling from :data:`HELLO_BACKOFF_START`
    to ``cap``, each times a random factor in [0.5, 1] so that agents detached by the
    same event (a master gone) do not all call at once."""
    rng = rng or random.Random()
    delay = HELLO_BACKOFF_START
    while True:
        yield min(cap, delay) * rng.uniform(0.5, 1.0)
        delay = min(cap, delay * 2)


class Greeter:
    """An agent's hellos to its masters: at start, then whenever it is detached."""

    def __init__(
        self,
        core: AgentCore,
        masters: Sequence[str],
        address: str,
        settings: Settings,
        labels: dict[str, str] | None = None,
        quiet: Callable[[], bool] = lambda: False,
    ) -> None:
        self.core = core
        self.masters = tuple(masters)
        self.address = address
        self.settings = settings
        self.labels = dict(labels or {})
        #: True while the agent must not ask for work (it drains).
        self.quiet = quiet
        #: Rounds of hellos said so far, and how many of them some master recorded.
        self.heard = 0
        self._stop = threading.Event()

    def detached(self) -> bool:
        """Never polled yet, or not polled for longer than the detach time."""
        served, silent, detach = self.core.silence()
        return not served or (detach is not None and silent > detach)

    def say_hello(self) -> bool:
        """One hello to each master; True if any recorded it."""
        recorded = False
        for master in self.masters:
            try:
                hello(master, self.address, self.core.slots, self.settings, self.labels)
            except JodlError as exc:
                log.warning("agent %s: %s", self.address, exc)
            else:
                recorded = True
                log.info("agent %s said hello to the master at %s", self.address, master)
        self.heard += recorded
        return recorded

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, name="hello", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        pauses = hello_pauses(self.settings.agent_hello_backoff_max)
        wait = 0.0  # the first round at once
        while not self._stop.wait(wait):
            if self.quiet() or not self.detached():
                pauses = hello_pauses(self.settings.agent_hello_backoff_max)
                wait = HELLO_CHECK
                continue
            self.say_hello()
            wait = next(pauses)

    def close(self) -> None:
        self._stop.set()


def master_addresses(values: Sequence[str]) -> list[str]:
    """``--register`` values (repeatable, each maybe a comma list) as HOST:PORT addresses."""
    out: list[str] = []
    for value in values:
        for part in value.split(","):
            address = part.strip()
            if address:
                split_address(address)  # ValueError names what is wrong
                if address not in out:
                    out.append(address)
    return out
