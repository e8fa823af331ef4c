"""The families an agent runs: their classes, as reported, and one instance of each."""

from __future__ import annotations

import threading
from typing import Any

from ..exceptions import UnknownFamily
from ..family import Family

#: A family as the agent reports it: name, version, is_async, idempotent.
FamilyRow = tuple[str, str, bool, bool]


class Installed:
    """The agent's family classes; each is instantiated once, on its first job."""

    def __init__(self, classes: dict[str, type[Family]], agent: str, context: dict[str, Any]):
        self.classes = classes
        self.agent = agent
        self.context = context
        self._instances: dict[str, Family] = {}
        self._lock = threading.Lock()

    def rows(self) -> tuple[FamilyRow, ...]:
        return tuple(
            (name, str(cls.version), cls.is_async(), bool(cls.idempotent))
            for name, cls in sorted(self.classes.items())
        )

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
