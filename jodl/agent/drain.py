"""Draining an agent: it takes nothing new, finishes what it has, hands it over, exits.

Asked by SIGTERM on the agent or by the master (``jodl node drain HOST:PORT``, relayed
by the master's ``draining`` call, since only the master calls agents). Jobs already
sent still run (those queued too: they are in flight for the master), and their
results are held until the master acknowledges them after its commit. The agent is
*drained* once nothing is queued, running or held and the master has heard that it
drains (so it sends nothing more), or no master polls it (never served, or detached:
a master that comes back cancels what it gave up on anyway). Then it exits. Exiting
early is never unsafe, only untidy: a send that reaches an agent gone is lost on the
master and placed elsewhere, and those jobs never started. See
docs/architecture.md, "Drain".
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from .core import AgentCore

log = logging.getLogger("jodl.agent")

#: Seconds between two looks at whether the agent is drained (what is left ends with
#: an acknowledgement from the master, which polls far less often than this).
DRAIN_CHECK = 0.05


class Drain:
    """Whether the agent drains, and whether the master knows it."""

    def __init__(self, core: AgentCore) -> None:
        self.core = core
        self._lock = threading.Lock()
        #: Asked to drain (SIGTERM or the master).
        self.requested = False
        #: The master's ``draining`` call has heard the answer True: it sends nothing more.
        self.reported = False
        self._stop = threading.Event()

    def start(self, why: str) -> None:
        """Drain from now on (idempotent)."""
        with self._lock:
            if self.requested:
                return
            self.requested = True
        log.warning(
            "agent %s drains (%s): takes nothing new, exits when handed over", self.core.name, why
        )

    def answer(self, start: bool) -> bool:
        """The master's ``draining`` call: ``start`` asks to drain; True: draining."""
        if start:
            self.start("asked by the master")
        with self._lock:
            if self.requested:
                self.reported = True
            return self.requested

    def drained(self) -> bool:
        """Nothing left to hand over, and the master knows to send nothing more."""
        with self._lock:
            if not self.requested:
                return False
            reported = self.reported
        served, silent, detach = self.core.silence()
        unheard = not served or (detach is not None and silent > detach)
        return (reported or unheard) and self.core.remaining() == (0, 0, 0, 0)

    def exit_when_drained(self, close: Callable[[], None]) -> threading.Thread:
        """Call ``close`` (stop serving) from a daemon thread once :meth:`drained`."""

        def watch() -> None:
            while not self._stop.wait(DRAIN_CHECK):
                if self.drained():
                    log.warning(
                        "agent %s drained: every result acknowledged; exiting", self.core.name
                    )
                    close()
                    return

        thread = threading.Thread(target=watch, name="drain", daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self._stop.set()
