"""Strategies by name: the built-in ones register here when :mod:`jodl.placement` is
imported, your own through :func:`register` or the entry-point group ``jodl.placements``."""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import entry_points
from typing import Any

from .interface import Placement

#: Strategy of a family that names none.
DEFAULT_STRATEGY = "earliest_finish"

#: name -> strategy class, filled by :func:`register`.
STRATEGIES: dict[str, type[Placement]] = {}


def register(cls: type[Placement]) -> type[Placement]:
    """Make a strategy selectable by its ``name`` (usable as a class decorator)."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    STRATEGIES[cls.name] = cls
    return cls


def strategy(name: str | None, params: dict[str, Any] | None = None) -> Placement:
    """An instance of the strategy registered as ``name``, built with ``params``."""
    name = name or DEFAULT_STRATEGY
    if name not in STRATEGIES:
        for ep in entry_points(group="jodl.placements"):
            if ep.name == name:
                register(ep.load())
    try:
        cls = STRATEGIES[name]
    except KeyError:
        known_names = ", ".join(sorted(STRATEGIES))
        raise ValueError(f"unknown placement strategy {name!r} (known: {known_names})") from None
    try:
        return cls(**(params or {}))
    except TypeError as exc:
        raise ValueError(f"bad parameters for placement strategy {name!r}: {exc}") from None


def known() -> Iterable[str]:
    """Names of the registered strategies."""
    return sorted(STRATEGIES)
