"""Placement: which node runs a job — the interface, what it may see, the strategies.

A strategy is a small class: :meth:`Placement.choose` picks one node for one job
among the nodes its family may use (FamilyOnNode), from a read-only view of what
the master knows: per node the expected work already queued there, its slots,
its learned speed and the expected work per cycle of the jobs whose home it is
(:class:`NodeLoad`), and per job and node the learned durations
(:class:`Knowledge`). The master calls :meth:`Placement.place` once per loop step
with every job that needs a node, so a strategy sees the whole batch. While
balancing, the master also asks :meth:`Placement.moves` for moves of its own.

Strategies are selected per family by name (``Family.strategy``) with parameters
(``Family.strategy_params``); register your own with :func:`register` or the
entry-point group ``jodl.placements``. ``docs/placement.md`` shows how to write one.

Layout (each module imports only those above it):

* :mod:`~jodl.placement.view` — :class:`JobInfo`, :class:`NodeLoad`, :func:`per_cycle`;
* :mod:`~jodl.placement.knowledge` — :class:`Knowledge` (learned durations and node
  speeds) and :data:`DEFAULT_DURATION`;
* :mod:`~jodl.placement.interface` — the :class:`Placement` base class and what
  balancing shows it (:class:`BalanceView`, :class:`Waiting`, :class:`Move`);
* :mod:`~jodl.placement.registry` — strategies by name (:func:`register`,
  :func:`strategy`);
* :mod:`~jodl.placement.strategies` — the built-in strategies, registered when this
  package is imported.
"""

from . import strategies as _builtin  # noqa: F401 - registers the built-in strategies
from .interface import BalanceView, Move, Placement, Waiting, account_homes, usable
from .knowledge import DEFAULT_DURATION, RECENT_WEIGHT, Knowledge, Learned
from .registry import DEFAULT_STRATEGY, known, register, strategy
from .view import JobInfo, NodeLoad, per_cycle

__all__ = [
    "DEFAULT_DURATION",
    "DEFAULT_STRATEGY",
    "RECENT_WEIGHT",
    "BalanceView",
    "JobInfo",
    "Knowledge",
    "Learned",
    "Move",
    "NodeLoad",
    "Placement",
    "Waiting",
    "account_homes",
    "known",
    "per_cycle",
    "register",
    "strategy",
    "usable",
]
