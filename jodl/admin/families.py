"""Families configured without code: settings, which nodes may run them, their jobs.

:class:`FamilyAdmin` is the one gateway of ``jodl family …``, ``jodl jobs list``
and the web's family pages: every statement they need is one named method here,
every change is validated in full before one transaction writes it (a bad value
changes nothing).

Settings of the family row: ``timeout``, ``max_attempts``, ``idempotent``,
``strategy`` with ``strategy_params`` (checked against the registered placement
strategies and the balancing knobs), ``schedule`` (a cron line that ``jodl
master`` honours, see :mod:`jodl.admin.schedule`). Settings of its jobs,
applied to every job the family has: ``every_n_cycles``, ``min_interval``,
``priority``.

A serving master reads a family's settings and node rules when a cycle of it
opens (and a fresh ``jodl run`` reads them at start).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field, fields
from typing import Any

from ..exceptions import JodlError
from ..log.family_admin import FamilyAdminLog, FamilyFacts
from ..log.models import FamilyRow, JobState
from ..log.store import Store

#: Written as a family's schedule to turn it off.
SCHEDULE_OFF = "off"
#: Most jobs ``jobs list`` returns at once.
MAX_JOBS_LISTED = 10_000
#: Job states ``jobs list --state`` accepts.
JOB_STATES = (
    JobState.IDLE,
    JobState.QUEUED,
    JobState.CLAIMED,
    JobState.DONE,
    JobState.DEAD,
    JobState.DELETED,
)
#: Settings kept on the family row, and those applied to each of its jobs.
FAMILY_FIELDS = (
    "timeout",
    "max_attempts",
    "idempotent",
    "strategy",
    "strategy_params",
    "schedule",
)
JOB_FIELDS = ("every_n_cycles", "min_interval", "priority")
SETTABLE = FAMILY_FIELDS + JOB_FIELDS
#: A new job's values of JOB_FIELDS when its family sets none.
JOB_DEFAULTS: dict[str, Any] = {"every_n_cycles": 1, "min_interval": None, "priority": 0}


class BadSetting(JodlError):
    """A family setting, node rule or listing option that cannot be accepted."""


#: What to install for cron schedules (APScheduler reads the crontab lines and fires them).
CRON_EXTRA = "pip install 'jodl[cron]'"


def cron_trigger(expression: str, timezone: Any = None) -> Any:
    """An APScheduler trigger for a crontab line (``MIN HOUR DAY MONTH WEEKDAY``, or ``SEC``
    first); :class:`JodlError` saying what to install when APScheduler is missing."""
    try:
        from apscheduler.triggers.cron import CronTrigger  # type: ignore[import-untyped]
    except ModuleNotFoundError:
        raise JodlError(
            f"cron schedules need APScheduler, which is not installed: {CRON_EXTRA}"
        ) from None
    fields = expression.split()
    if len(fields) == 6:
        second, minute, hour, day, month, dow = fields
        return CronTrigger(
            second=second,
            minute=minute,
            hour=hour,
            day=day,
            month=month,
            day_of_week=dow,
            timezone=timezone,
        )
    return CronTrigger.from_crontab(expression, timezone=timezone)


@dataclass(frozen=True)
class NodeRule:
    """Whether a node may run a family (FamilyOnNode), as shown to operators."""

    address: str
    allowed: bool
    max_slots: int | None
    labels: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.address,
            "allowed": self.allowed,
            "max_slots": self.max_slots,
            "labels": dict(self.labels),
        }


@dataclass(frozen=True)
class FamilyInfo:
    """A family's settings, its job counts and its node rules."""

    name: str
    strategy: str
    strategy_params: dict[str, Any]
    schedule: str | None
    timeout: float | None
    max_attempts: int | None
    idempotent: bool
    jobs: int
    #: every_n_cycles, min_interval, priority: the value all its jobs share, or "mixed".
    job_settings: dict[str, Any] = field(default_factory=dict)
    nodes: tuple[NodeRule, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "strategy": self.strategy,
            "strategy_params": dict(self.strategy_params),
            "schedule": self.schedule,
            "timeout": self.timeout,
            "max_attempts": self.max_attempts,
            "idempotent": self.idempotent,
            "jobs": self.jobs,
            **self.job_settings,
            "nodes": [r.as_dict() for r in self.nodes],
        }


@dataclass(frozen=True)
class JobRow:
    """One job of a family, as ``jobs list`` shows it."""

    id: int
    key: str
    state: str
    priority: int
    every_n_cycles: int
    min_interval: float | None
    attempts: int
    failures: int
    due_at: dt.datetime | None
    last_done_at: dt.datetime | None
    last_error: str | None

    def as_dict(self) -> dict[str, Any]:
        def iso(value: dt.datetime | None) -> str | None:
            return value.isoformat(timespec="seconds") + "Z" if value else None

        return {
            "id": self.id,
            "key": self.key,
            "state": self.state,
            "priority": self.priority,
            "every_n_cycles": self.every_n_cycles,
            "min_interval": self.min_interval,
            "attempts": self.attempts,
            "failures": self.failures,
            "due_at": iso(self.due_at),
            "last_done_at": iso(self.last_done_at),
            "last_error": self.last_error,
        }


# -- validation (pure: nothing is read or written) ------------------------------------------------


def _number(name: str, value: Any, *, whole: bool, least: float, none: bool) -> Any:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        if none:
            return None
        raise BadSetting(f"{name}: a value is required")
    if isinstance(value, bool):
        raise BadSetting(f"{name}: a number, not {value!r}")
    try:
        number = int(value) if whole else float(value)
        if whole and isinstance(value, float) and value != number:
            raise ValueError
    except (TypeError, ValueError):
        kind = "a whole number" if whole else "a number"
        raise BadSetting(f"{name}: {kind}, not {value!r}") from None
    if number != number or number < least or number in (float("inf"), float("-inf")):
        raise BadSetting(f"{name}: at least {least:g}, not {value!r}")
    return number


def _idempotent(family: FamilyRow) -> bool:
    """Whether the family's jobs may run twice: as its class installed here declares
    (:attr:`jodl.family.Family.idempotent`, which the master follows on each agent),
    unless an operator turned it off. Without the class here: the row's setting."""
    if family.idempotent is False:
        return False
    from ..family import installed_class

    try:
        cls = installed_class(family.name)
    except Exception:  # noqa: BLE001 - a broken package: its row decides
        cls = None
    if cls is None:
        return bool(family.idempotent)
    return bool(cls.idempotent)


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise BadSetting(f"{name}: true or false, not {value!r}")


def check_schedule(value: Any) -> str | None:
    """A valid cron line (5 fields, or 6 with seconds first), or None for no schedule."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadSetting("schedule: a cron line ([SEC] MIN HOUR DAY MONTH WEEKDAY) or 'off'")
    text = " ".join(value.split())
    if text.lower() in (SCHEDULE_OFF, "", "none"):
        return None
    try:
        cron_trigger(text)
    except (ValueError, TypeError) as exc:
        raise BadSetting(
            f"schedule: {text!r} is not a cron line ([SEC] MIN HOUR DAY MONTH WEEKDAY) "
            f"nor 'off' ({exc})"
        ) from None
    return text


def check_strategy(name: str, params: dict[str, Any], family: FamilyRow) -> None:
    """Refuse a strategy not registered, or parameters it (or balancing) does not take."""
    from ..master.rules import Tuning
    from ..placement import known, strategy

    try:
        tuning, own = Tuning.split(params, timeout=family.timeout, idempotent=family.idempotent)
        for knob in fields(tuning):
            value, default = getattr(tuning, knob.name), knob.default
            if isinstance(default, bool) and not isinstance(value, bool):
                raise ValueError(f"bad balancing parameter: {knob.name} is true or false")
            if (
                isinstance(default, (int, float))
                and not isinstance(default, bool)
                and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0)
            ):
                raise ValueError(f"bad balancing parameter: {knob.name} is a number >= 0")
        strategy(name, own)
    except ValueError as exc:
        text = str(exc)
        if "known:" not in text:
            text += f" (known strategies: {', '.join(known())})"
        raise BadSetting(f"strategy: {text}") from None


def clean_settings(changes: dict[str, Any]) -> dict[str, Any]:
    """The changes checked and converted; :class:`BadSetting` for the first bad one."""
    unknown = sorted(set(changes) - set(SETTABLE))
    if unknown:
        raise BadSetting(f"cannot set {', '.join(unknown)} (settable: {', '.join(SETTABLE)})")
    out: dict[str, Any] = {}
    for name, value in changes.items():
        if name == "timeout":
            out[name] = _number(name, value, whole=False, least=0.001, none=True)
        elif name == "max_attempts":
            out[name] = _number(name, value, whole=True, least=1, none=True)
        elif name == "idempotent":
            # "none": no override, the family class decides (Family.idempotent).
            follows = value is None or str(value).strip().lower() in ("none", "class")
            out[name] = None if follows else _flag(name, value)
        elif name == "strategy":
            if not isinstance(value, str) or not value.strip():
                raise BadSetting("strategy: the name of a placement strategy")
            out[name] = value.strip()
        elif name == "strategy_params":
            if not isinstance(value, dict):
                raise BadSetting("strategy_params: a JSON object")
            out[name] = dict(value)
        elif name == "schedule":
            out[name] = check_schedule(value)
        elif name == "every_n_cycles":
            out[name] = _number(name, value, whole=True, least=1, none=False)
        elif name == "min_interval":
            out[name] = _number(name, value, whole=False, least=0, none=True)
        elif name == "priority":
            out[name] = _number(name, value, whole=True, least=-(2**31), none=False)
    return out


def check_labels(labels: Any) -> dict[str, str]:
    """KEY=VALUE pairs (a dict, or a list of ``"k=v"`` texts) as a dict of texts."""
    pairs: list[tuple[Any, Any]] = []
    if isinstance(labels, dict):
        pairs = list(labels.items())
    else:
        for item in labels or ():
            if not isinstance(item, str) or "=" not in item or item.startswith("="):
                raise BadSetting(f"label {item!r}: write KEY=VALUE")
            key, value = item.split("=", 1)
            pairs.append((key, value))
    out = {}
    for key, value in pairs:
        if not isinstance(key, str) or not key or not isinstance(value, (str, int, float)):
            raise BadSetting(f"label {key!r}: a text key with a text value")
        out[key] = str(value)
    return out


# -- the gateway ----------------------------------------------------------------------------------


class FamilyAdmin:
    """Reads and changes families' settings, node rules and jobs (one transaction each).

    The statements live in :class:`jodl.log.family_admin.FamilyAdminLog`; this class
    validates what people ask for and shapes what they are shown.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self.log = FamilyAdminLog(store.engine)

    @staticmethod
    def _info(facts: FamilyFacts) -> FamilyInfo:
        family = facts.family
        shared: dict[str, Any] = {}
        for name in JOB_FIELDS:
            values = facts.job_values.get(name, [])
            if not values:  # no jobs yet: what new ones will get
                default = ((family.settings or {}).get("job_defaults") or {}).get(name)
                shared[name] = default if default is not None else JOB_DEFAULTS[name]
            else:
                shared[name] = values[0] if len(values) == 1 else "mixed"
        rules = [
            NodeRule(
                address,
                bool(rule.allowed),
                rule.max_slots,
                dict((rule.conditions or {}).get("labels") or {}),
            )
            for address, rule in facts.rules
        ]
        return FamilyInfo(
            name=family.name,
            strategy=family.strategy,
            strategy_params=dict(family.strategy_params or {}),
            schedule=family.schedule,
            timeout=family.timeout,
            max_attempts=family.max_attempts,
            idempotent=_idempotent(family),
            jobs=facts.jobs,
            job_settings=shared,
            nodes=tuple(rules),
        )

    def families(self) -> list[FamilyInfo]:
        """Every family, by name."""
        return [self._info(f) for f in self.log.all_facts(JOB_FIELDS)]

    def family(self, name: str) -> FamilyInfo:
        """One family; :class:`UnknownFamily` naming the known ones if there is none."""
        return self._info(self.log.facts(name, JOB_FIELDS))

    def schedules(self) -> dict[str, str]:
        """Family name -> cron line, for the families that have a schedule."""
        return self.log.schedules()

    def update(self, name: str, changes: dict[str, Any]) -> FamilyInfo:
        """Apply ``changes`` (names of :data:`SETTABLE`) all at once, or none of them."""
        if not changes:
            raise BadSetting(f"nothing to set (settable: {', '.join(SETTABLE)})")
        clean = clean_settings(changes)

        def check(family: FamilyRow) -> None:
            if clean.get("idempotent") is True and not _idempotent(family):
                raise BadSetting(
                    f"idempotent: the class of {name} says its jobs must not run twice "
                    "(Family.idempotent = False); only the class can allow it"
                )
            if "strategy" in clean or "strategy_params" in clean or "timeout" in clean:
                check_strategy(family.strategy, dict(family.strategy_params or {}), family)

        facts = self.log.update(
            name,
            {k: clean[k] for k in FAMILY_FIELDS if k in clean},
            {k: clean[k] for k in JOB_FIELDS if k in clean},
            check,
            JOB_FIELDS,
        )
        return self._info(facts)

    def set_nodes(
        self,
        name: str,
        addresses: list[str],
        allowed: bool,
        max_slots: int | None = None,
        labels: dict[str, str] | None = None,
    ) -> FamilyInfo:
        """Allow (with an optional cap and required labels) or deny ``family`` on nodes."""
        if not addresses:
            raise BadSetting("name at least one node (--node HOST:PORT)")
        if max_slots is not None:
            max_slots = _number("max_slots", max_slots, whole=True, least=1, none=False)
        if not allowed and (max_slots is not None or labels):
            raise BadSetting("deny takes no --max-slots nor --label: the family never runs there")
        self.log.facts(name, ())  # an unknown family is named before unknown nodes
        ids = self.log.node_ids(addresses)
        for address in addresses:
            if address not in ids:
                raise BadSetting(
                    f"no node {address!r}: add it with `jodl node add {address}` first"
                )
        conditions = {"labels": dict(labels)} if labels else {}
        node_ids = list(dict.fromkeys(ids[a] for a in addresses))
        facts = self.log.set_rules(name, node_ids, allowed, max_slots, conditions, JOB_FIELDS)
        return self._info(facts)

    def remove(self, name: str) -> int:
        """Remove a family whose jobs are all deleted (and that runs no cycle now), with
        its runs and results; how many deleted jobs went with it. A family that still
        has jobs or a running run is refused with the reason, nothing removed."""
        return self.log.remove(name)

    def jobs(self, name: str, state: str | None = None, limit: int = 50) -> list[JobRow]:
        """Jobs of the family (in one state if given), oldest first, at most ``limit``."""
        if state is not None and state not in JOB_STATES:
            raise BadSetting(f"state: one of {', '.join(JOB_STATES)}, not {state!r}")
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not (1 <= limit <= MAX_JOBS_LISTED)
        ):
            raise BadSetting(f"limit: a whole number from 1 to {MAX_JOBS_LISTED}")
        return [
            JobRow(
                id=j.id,
                key=j.key,
                state=j.state,
                priority=j.priority,
                every_n_cycles=j.every_n_cycles,
                min_interval=j.min_interval,
                attempts=j.attempts,
                failures=j.failures,
                due_at=j.due_at,
                last_done_at=j.last_done_at,
                last_error=j.last_error,
            )
            for j in self.log.jobs(name, state, limit)
        ]


__all__ = [
    "JOB_STATES",
    "MAX_JOBS_LISTED",
    "SETTABLE",
    "BadSetting",
    "FamilyAdmin",
    "FamilyInfo",
    "JobRow",
    "NodeRule",
    "check_labels",
    "check_schedule",
    "clean_settings",
    "cron_trigger",
]
