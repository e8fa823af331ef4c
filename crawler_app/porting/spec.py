"""What an import file says, before anything is written: one :class:`TrackingSpec` per
tracking, the :class:`Problem` of each entry that cannot be mapped, and notes on
what was read but is not kept."""

from __future__ import annotations

from dataclasses import dataclass, field

from jodl.exceptions import JodlError

from ..checking.due import Schedule
from ..fetching.filters import ViewSpec

#: Largest import file read, in bytes (a file of a few thousand trackings is far smaller).
MAX_IMPORT_BYTES = 1_000_000
#: Problems named in the one-line message of a refused import (all are in ``problems``).
PROBLEMS_SHOWN = 5


@dataclass(frozen=True)
class Problem:
    """An entry of the file that cannot be imported: where it is (``line``, 1-based, for
    YAML; ``where``, a position such as ``trackings[2]``, for JSON) and why."""

    message: str
    line: int | None = None
    where: str | None = None

    def __str__(self) -> str:
        if self.line is not None:
            return f"line {self.line}: {self.message}"
        if self.where is not None:
            return f"{self.where}: {self.message}"
        return self.message

    def as_dict(self) -> dict[str, object]:
        return {"line": self.line, "where": self.where, "message": self.message}


class ImportRefused(JodlError):
    """An import file with entries that cannot be mapped; nothing of it was imported."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        shown = "; ".join(str(p) for p in problems[:PROBLEMS_SHOWN])
        more = len(problems) - PROBLEMS_SHOWN
        tail = f"; and {more} more" if more > 0 else ""
        super().__init__(
            f"nothing imported, {len(problems)} entr{'y' if len(problems) == 1 else 'ies'} "
            f"cannot be mapped: {shown}{tail}"
        )


@dataclass(frozen=True)
class TrackingSpec:
    """One tracking an import file asks for. ``None`` in ``tags``, ``paused``, ``browser``,
    ``period``, ``schedule``, ``name``: the file does not say (a tracking the user has
    keeps its own)."""

    url: str  # normalised
    view: ViewSpec
    tags: tuple[str, ...] | None = None
    paused: bool | None = None
    browser: bool | None = None
    period: int | None = None
    schedule: Schedule | None = None
    name: str | None = None
    #: Where the entry is in the file: its first line (YAML), or its position
    #: (JSON: ``trackings[1].views[0]``).
    line: int | None = None
    where: str | None = None

    @property
    def origin(self) -> str:
        return f"line {self.line}" if self.line is not None else self.where or "an entry"


@dataclass
class Parsed:
    """A file read: its trackings, its problems, and notes on what it had that is not kept."""

    specs: list[TrackingSpec] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def checked(self) -> Parsed:
        """Itself, or :class:`ImportRefused` naming every problem; two entries for the
        same page and filters are one."""
        seen: dict[tuple[str, str], str] = {}
        for spec in self.specs:
            key = (spec.url, spec.view.key)
            if key in seen:
                self.problems.append(
                    Problem(
                        f"the same page and filters as {seen[key]}",
                        line=spec.line,
                        where=spec.where,
                    )
                )
            seen.setdefault(key, spec.origin)
        if self.problems:
            raise ImportRefused(self.problems)
        return self


@dataclass(frozen=True)
class Exported:
    """A tracking as written out (one urlwatch job, one entry of our JSON format)."""

    url: str
    title: str | None
    view: ViewSpec
    tags: tuple[str, ...]
    paused: bool
    browser: bool
    period: int
    schedule: Schedule = Schedule()
    name: str | None = None
