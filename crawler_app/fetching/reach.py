"""Who a fetch is for: whether a ``check_page`` job may reach the fetch allowlist.

``JODL_FETCH_ALLOW`` admits private networks (an intranet, loopback) on the
agents. Which *jobs* may use it is decided where the job is queued, from who
asked, never from anything a visitor sends:

* each job's payload carries its :class:`Reach` (key :data:`PAYLOAD_KEY`); the
  agent reads it and, for a job whose reach is not :attr:`Reach.ALLOWLIST`, treats
  the allowlist as empty at every hop (DNS answer, redirects, a rendered page's
  requests). A payload without the key, or with any other value, is public only;
* the operator names who may use the allowlist with ``JODL_FETCH_ALLOW_USERS``
  (:class:`AllowUsers`): e-mail addresses, ``operators`` (users with the admin
  role) or ``*`` (every user with an account). Visitors who are not signed in
  never may;
* a tracked page is fetched once per cycle for all its trackers: its jobs may use
  the allowlist when at least one of its trackers may (:func:`allowlisted_pages`).
  That tracker asked for the page; the others only see what it would see.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy.orm import Session

from . import queries

#: Key of a ``check_page`` payload that carries the job's :class:`Reach`.
PAYLOAD_KEY = "reach"
#: The setting naming who may use the allowlist, named in errors.
USERS_SETTING = "JODL_FETCH_ALLOW_USERS"
#: Entry of :data:`USERS_SETTING` admitting every operator (admin role).
OPERATORS = "operators"
#: Entry of :data:`USERS_SETTING` admitting every user with an account.
EVERYONE = "*"
#: Its default: operators are trusted with the cluster already; other users are
#: named by the operator (sign-up may be open to anyone).
DEFAULT_USERS = OPERATORS


class Reach(StrEnum):
    """Which addresses a job's fetches may reach."""

    #: Public addresses only (the allowlist is treated as empty).
    PUBLIC = "public"
    #: Public addresses and the networks of ``JODL_FETCH_ALLOW``.
    ALLOWLIST = "allowlist"

    @classmethod
    def of_payload(cls, payload: Mapping[str, Any]) -> Reach:
        """The reach a payload asks for: :attr:`ALLOWLIST` only when it says so exactly."""
        return cls.ALLOWLIST if payload.get(PAYLOAD_KEY) == cls.ALLOWLIST.value else cls.PUBLIC

    def mark(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``payload`` with this reach written into it (returned for chaining)."""
        payload[PAYLOAD_KEY] = self.value
        return payload


@dataclass(frozen=True)
class AllowUsers:
    """``JODL_FETCH_ALLOW_USERS``: the users whose jobs may use the fetch allowlist."""

    emails: frozenset[str] = frozenset()
    operators: bool = False
    everyone: bool = False

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowUsers:
        """From the setting's entries; ValueError naming a bad one."""
        emails: set[str] = set()
        operators = everyone = False
        for raw in entries:
            entry = str(raw).strip().lower()
            if entry == OPERATORS:
                operators = True
            elif entry == EVERYONE:
                everyone = True
            elif "@" in entry and " " not in entry and not entry.startswith("@"):
                emails.add(entry)
            elif entry:
                raise ValueError(
                    f"{raw!r} is neither an e-mail address, {OPERATORS!r} nor {EVERYONE!r}"
                )
        return cls(frozenset(emails), operators, everyone)

    def reach(self, email: str | None, is_admin: bool = False) -> Reach:
        """The reach of a job asked for by this user (None: a visitor not signed in)."""
        if email is None:
            return Reach.PUBLIC
        allowed = self.everyone or (self.operators and is_admin) or email.lower() in self.emails
        return Reach.ALLOWLIST if allowed else Reach.PUBLIC


def allowlisted_pages(
    session: Session, allow: AllowUsers, page_ids: Iterable[int] | None = None
) -> set[int]:
    """Ids of the pages (of ``page_ids``; None: all) that a user admitted by ``allow``
    tracks: their jobs may use the allowlist."""
    return queries.pages_tracked_by_admitted(
        session,
        emails=allow.emails,
        operators=allow.operators,
        everyone=allow.everyone,
        page_ids=page_ids,
    )


__all__ = [
    "DEFAULT_USERS",
    "EVERYONE",
    "OPERATORS",
    "PAYLOAD_KEY",
    "USERS_SETTING",
    "AllowUsers",
    "Reach",
    "allowlisted_pages",
]
