"""Which open runs some live agent can run, and saying so at once when none can.

A run whose family no connected agent serves (not installed there, another
version, denied by its node rules, or only on draining nodes) would otherwise wait
in silence: its jobs are never placed. The master asks, per open run, whether a
node could take its jobs now (at most every :data:`REVIEW_EVERY` seconds; a new run,
or one no agent serves, at every step); when the answer changes it logs a line and
records the reason on the run (``jodl_run.unserved``), which ``jodl run``, ``jodl
status``, the run page and the API show, e.g. "no agent serves wordcount: installed
on 0 of 2 agents". The jobs keep waiting, and are placed in the step after an agent
serves the family (installed there, then ``jodl node reload``: :mod:`.reloads`).
"""

from __future__ import annotations

import logging
import time
from typing import Final

from .nodes import Nodes, NodeSlot
from .parts import Parts
from .records import ActiveRun
from .rules import allows

log = logging.getLogger("jodl.master")

#: Seconds between two reviews of runs already reviewed: what the nodes serve changes
#: only when one (re)connects or fails, and the check walks every node per run.
REVIEW_EVERY = 0.25
#: What :func:`why_unserved` answers while agents are (re)connecting and none serves:
#: not known yet, the last verdict stands.
UNSURE: Final = "?"


def why_unserved(nodes: Nodes, family: str) -> str | None:
    """Why no connected agent can run ``family`` now (None: one can; :data:`UNSURE`:
    agents are still connecting)."""
    connected = [s for s in nodes if s.usable]
    if any(_serves(nodes, family, s) for s in connected):
        return None
    if any(s.opening is not None and not s.removed for s in nodes):
        return UNSURE
    have = [s for s in connected if family in s.families or family in s.wrong_version]
    notes = []
    other = [s for s in have if family in s.wrong_version]
    if other:
        theirs = ", ".join(sorted({s.wrong_version[family] or "?" for s in other}))
        known = nodes.versions.get(family) or "?"
        notes.append(f"{len(other)} at version {theirs}, this master knows {known}")
    draining = [s for s in have if s.draining and s not in other]
    if draining:
        notes.append(f"{len(draining)} draining")
    denied = [s for s in have if s not in other and s not in draining]
    if denied:
        notes.append(f"{len(denied)} not allowed by its node rules")
    away = sum(1 for s in nodes if not s.removed and not s.usable)
    if away:
        notes.append(f"{away} more unreachable")
    text = f"no agent serves {family}: installed on {len(have)} of {len(connected)} agents"
    return f"{text} ({'; '.join(notes)})" if notes else text


def _serves(nodes: Nodes, family: str, slot: NodeSlot) -> bool:
    """May ``slot`` run ``family``: as placement asks, but a node only late (past a
    timeout, for now) still counts."""
    if not slot.late:
        return nodes.allowed(family, slot)
    if family not in slot.families or slot.draining:
        return False
    rule = nodes.families.rule(family, slot.load.id)
    return rule is None or allows(rule.allowed, rule.conditions, slot.load.labels)


class Coverage:
    """Keeps each open run's ``unserved`` reason in step with what the agents serve."""

    def __init__(self, parts: Parts, nodes: Nodes) -> None:
        self.store = parts.store
        self.nodes = nodes
        self.runs = parts.runs
        #: run id -> the reason recorded for it (None: served).
        self.said: dict[int, str | None] = {}
        self._last = 0.0

    def review(self) -> None:
        """Record (and log) every open run whose answer changed; new runs at once."""
        now = time.monotonic()
        due = now - self._last >= REVIEW_EVERY
        # A run waiting for an agent is looked at every step: its jobs are placed in
        # the step an agent serves it, and it says so first.
        if not due and all(self.said.get(run_id, "?") is None for run_id in self.runs):
            return
        if due:
            self._last = now
        for run_id in [r for r in self.said if r not in self.runs]:
            del self.said[run_id]  # finished or cancelled
        for run_id, active in self.runs.items():
            if not due and run_id in self.said and self.said[run_id] is None:
                continue
            why = why_unserved(self.nodes, active.family.name)
            if why == UNSURE:
                continue
            before = self.said.get(run_id, active.run.unserved)
            self.said[run_id] = why
            if why == before:
                continue
            self.store.set_run_unserved(run_id, why)
            self._tell(active, why)

    def _tell(self, active: ActiveRun, why: str | None) -> None:
        name, number = active.family.name, active.run.number
        extra = {"run_id": active.run.id, "family": name}
        if why is not None:
            log.warning(
                "run %s#%d: %s; its jobs wait (install the family on an agent, then "
                "`jodl node reload`)",
                name, number, why, extra=extra,
            )  # fmt: skip
            return
        serving = sum(1 for s in self.nodes if s.usable and _serves(self.nodes, name, s))
        log.warning(
            "run %s#%d: served again, by %d agent%s",
            name, number, serving, "" if serving == 1 else "s", extra=extra,
        )  # fmt: skip


__all__ = ["REVIEW_EVERY", "UNSURE", "Coverage", "why_unserved"]
