"""What the master knows of each family it runs: strategy, limits, node rules, tuning."""

from __future__ import annotations

import json
from typing import Any

from ..log.models import FamilyOnNode, FamilyRow
from ..log.store import Store
from ..placement import Placement, strategy
from .rules import Tuning


class FamilySettings:
    """Per family: its placement strategy, attempts, FamilyOnNode rules and caps, tuning.

    Read from the log when a family's first job comes, when a cycle of it opens and,
    in a serving master, every few seconds: an operator's ``jodl family
    set|allow|deny`` holds from then on.
    """

    def __init__(self, store: Store, default_attempts: int) -> None:
        self.store = store
        self.default_attempts = default_attempts
        #: family -> its placement instance (kept while its parameters stay the same).
        self.strategies: dict[str, Placement] = {}
        #: family -> (strategy, parameters) its placement instance was built from.
        self._built: dict[str, tuple[str, str]] = {}
        #: family -> attempts of a job before it is dead.
        self.max_attempts: dict[str, int] = {}
        #: node_id -> {family: most of its jobs in flight there} (FamilyOnNode.max_slots).
        self.caps: dict[int, dict[str, int]] = {}
        #: family -> its balancing knobs.
        self.tuning: dict[str, Tuning] = {}
        #: family -> node_id -> its FamilyOnNode rule.
        self.rules: dict[str, dict[int, FamilyOnNode]] = {}

    def known(self, name: str) -> bool:
        return name in self.strategies

    def setup(self, family: FamilyRow, reload: bool = False) -> None:
        """Read ``family``'s settings and node rules (again, with ``reload``)."""
        if not reload and family.name in self.strategies:
            return
        tuning, params = Tuning.split(
            family.strategy_params, timeout=family.timeout, idempotent=family.idempotent
        )
        self.tuning[family.name] = tuning
        self.rules[family.name] = self.store.family_rules(family.id)
        built = (family.strategy, json.dumps(params, sort_keys=True, default=str))
        if self._built.get(family.name) != built:  # a strategy keeps what it learned
            self.strategies[family.name] = strategy(family.strategy, params)
            self._built[family.name] = built
        self.max_attempts[family.name] = family.max_attempts or self.default_attempts
        for caps in self.caps.values():
            caps.pop(family.name, None)
        for node_id, rule in self.rules[family.name].items():
            if rule.allowed and rule.max_slots:
                self.caps.setdefault(node_id, {})[family.name] = rule.max_slots

    def tuned(self, family: str) -> Tuning:
        return self.tuning.get(family) or _DEFAULT

    def kept(self, family: str) -> bool:
        """Whether the family's strategy keeps its jobs on the nodes it chose."""
        placement = self.strategies.get(family)
        return placement is not None and placement.keeps_nodes

    def rule(self, family: str, node_id: int) -> Any:
        return self.rules.get(family, {}).get(node_id)


_DEFAULT = Tuning()
