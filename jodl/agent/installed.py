"""The families an agent runs: their classes, as reported, and one instance of each.

They are read at the agent's start and again when it is asked to reload them
(``jodl node reload``, relayed by the master, or SIGHUP on the agent): a package
installed or upgraded meanwhile is served from then on. A reload changes only the
classes; queued jobs, running ones and held results stay as they are.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..exceptions import ConfigError, UnknownFamily
from ..family import Family

log = logging.getLogger("jodl.agent")

#: A family as the agent reports it: name, version, is_async, idempotent.
FamilyRow = tuple[str, str, bool, bool]


class Installed:
    """The agent's family classes; each is instantiated once, at start (:meth:`prepare`)
    or else on its first job."""

    def __init__(self, classes: dict[str, type[Family]], agent: str, context: dict[str, Any]):
        self.classes = classes
        self.agent = agent
        self.context = context
        #: Bumped by each :meth:`replace` that changed a class: the master, seeing
        #: another generation than at its ``init``, initialises the agent again.
        self.generation = 0
        self._instances: dict[str, Family] = {}
        self._lock = threading.Lock()

    def replace(self, classes: dict[str, type[Family]]) -> bool:
        """Serve ``classes`` from now on (instances of unchanged classes are kept); True
        when anything changed."""
        with self._lock:
            if classes == self.classes:
                return False
            self._instances = {
                name: inst
                for name, inst in self._instances.items()
                if classes.get(name) is type(inst)
            }
            self.classes = dict(classes)  # one assignment: readers see the old or the new
            self.generation += 1
            return True

    def rows(self) -> tuple[FamilyRow, ...]:
        return tuple(
            (name, str(cls.version), cls.is_async(), bool(cls.idempotent))
            for name, cls in sorted(self.classes.items())
        )

    def prepare(self) -> None:
        """Instantiate every family now: one whose settings are wrong stops the agent at
        start with its :class:`ConfigError` (one line naming the setting), as every
        process does, instead of failing each of its jobs later. Any other error of a
        family's start is logged and left to its first job, as before."""
        for name in sorted(self.classes):
            try:
                self.instance(name)
            except ConfigError:
                raise
            except Exception:  # noqa: BLE001 - the family's jobs report it again
                log.warning("family %s could not start; its jobs will fail", name, exc_info=True)

    def instance(self, name: str) -> Family:
        inst = self._instances.get(name)
        if inst is None:
            cls = self.classes.get(name)
            if cls is None:
                raise UnknownFamily(f"unknown family {name!r} on agent {self.agent}")
            with self._lock:
                inst = self._instances.get(name)
                if inst is None:
                    inst = self._instances[name] = cls(dict(self.context))
        return inst


__all__ = ["FamilyRow", "Installed"]
