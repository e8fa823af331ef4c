"""Entry points of installed packages: how the library finds applications' families,
commands, settings, services and migrations without naming them.

Two rules for every group:

* an entry point that names an extra (``name = module:attr [apps]``) is loaded only
  when every requirement of that extra is installed: ``pip install jodl`` gives the
  library alone, ``pip install 'jodl[apps]'`` adds the applications;
* an entry point whose own dependencies are missing all the same is left out, with a
  line in the debug log; one that is broken itself still raises.
"""

from __future__ import annotations

import logging
import re
from functools import cache
from importlib.metadata import Distribution, EntryPoint, PackageNotFoundError, distribution
from importlib.metadata import entry_points as installed_entry_points
from typing import Any

log = logging.getLogger("jodl.settings.plugins")

#: The distribution name at the start of a requirement line (``Flask>=3.0; extra == ...``).
REQUIREMENT_NAME = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def _extra_of(requirement: str) -> str | None:
    match = re.search(r"""extra\s*==\s*["']([^"']+)["']""", requirement.partition(";")[2])
    return match.group(1) if match else None


def _installed(name: str) -> bool:
    try:
        distribution(name)
    except PackageNotFoundError:
        return False
    return True


@cache
def extra_installed(dist_name: str, extra: str) -> bool:
    """True when every requirement of ``extra`` of the distribution is installed."""
    try:
        dist: Distribution = distribution(dist_name)
    except PackageNotFoundError:
        return False
    for requirement in dist.requires or ():
        if _extra_of(requirement) != extra:
            continue
        match = REQUIREMENT_NAME.match(requirement)
        if match and not _installed(match.group(1)):
            return False
    return True


def _wanted(ep: EntryPoint) -> bool:
    dist = getattr(ep, "dist", None)
    if not ep.extras or dist is None:
        return True
    return all(extra_installed(dist.metadata["Name"], extra) for extra in ep.extras)


def load_group(group: str) -> list[tuple[EntryPoint, Any]]:
    """Every loadable entry point of ``group`` with what it names, sorted by name."""
    found = []
    for ep in sorted(installed_entry_points(group=group), key=lambda ep: ep.name):
        loaded = _load(group, ep)
        if loaded is not _LEFT_OUT:
            found.append((ep, loaded))
    return found


def load_entry(group: str, name: str) -> Any:
    """What the entry point ``name`` of ``group`` names (None: none, or left out), with
    only its own module imported."""
    for ep in installed_entry_points(group=group, name=name):
        loaded = _load(group, ep)
        if loaded is not _LEFT_OUT:
            return loaded
    return None


_LEFT_OUT = object()


def _load(group: str, ep: EntryPoint) -> Any:
    """What ``ep`` names, or ``_LEFT_OUT`` (its extra or a dependency is not installed)."""
    if not _wanted(ep):
        log.debug("%s %s left out: extra %s not installed", group, ep.name, ep.extras)
        return _LEFT_OUT
    try:
        return ep.load()
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing == ep.module.partition(".")[0]:
            raise  # the package itself is broken, not one of its dependencies
        log.debug("%s %s left out: %s is not installed", group, ep.name, exc.name)
        return _LEFT_OUT


__all__ = ["extra_installed", "load_entry", "load_group"]
