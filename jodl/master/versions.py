"""Which version of each family this master knows, checked against what agents run.

An agent tells its families' versions at ``init``; a family it runs at another
version than the class installed with this master gets no job there. The check is
made when a job of that family is first placed on the agent, not when it connects:
knowing a version means importing the family's module, and an application's (the
page checker's, with its HTTP and HTML libraries) took a fifth of a second of a
restarted master's way to its first dispatch, for families it may not run at all.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

from ..family import Family as FamilyClass
from ..family import installed_class

log = logging.getLogger("jodl.master")


class Versions(Protocol):
    """family -> the version this master knows (None: not known, not checked)."""

    def get(self, name: str) -> str | None: ...


class InstalledVersions:
    """Versions of the families installed with this master, each read on first ask."""

    def __init__(self) -> None:
        self._known: dict[str, str | None] = {}

    def get(self, name: str) -> str | None:
        if name not in self._known:
            try:
                cls = installed_class(name)
            except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop the master
                log.warning("could not load the family %s (%s): version not checked", name, exc)
                cls = None
            self._known[name] = None if cls is None else str(cls.version)
        return self._known[name]


def known_versions(classes: Mapping[str, type[FamilyClass]]) -> dict[str, str]:
    """family -> version of the family classes this master knows."""
    return {name: str(cls.version) for name, cls in classes.items()}


__all__ = ["InstalledVersions", "Versions", "known_versions"]
