"""The page checker: users track web pages, each cycle fetches every tracked page on the
agents, detects real changes and notifies the users (docs/architecture.md#the-applications).

This package is the page checker's one gateway for the web UI: ``web`` imports the
names of :data:`__all__` from ``crawler_app`` and never from its modules
(tests/test_layers.py). The names load on first use (:func:`__getattr__`), so
``import crawler_app`` (which every ``check_page`` job on an agent does) loads none of
the database, mail or web modules.

The public face, by part:

* **users and trackings** (what ``jodl users``/``track`` and the web UI change): the
  tables (:class:`User`, :class:`Tracking`, :class:`Page`, :class:`PageView`,
  :class:`Snapshot`, :class:`Notification`, :class:`Delivery`, :class:`AppCycle`) and
  the operations on them (:func:`add_user`, :func:`track`, :func:`untrack`, ...), with
  their errors :class:`PageError` and :class:`QuotaExceeded` and the users' quotas;
* **fetching**: the address checks every fetch goes through (:func:`parse_url`,
  :func:`check_url`, :class:`FetchRefused`) and who may reach the fetch allowlist
  (:class:`Reach`, :class:`AllowUsers`);
* **checking**: a tracking's view and schedule (:class:`ViewSpec`, :class:`Schedule`),
  the ``check_page`` payload of a page (:func:`check_payload`), the cycle
  (:class:`PageCycle`) and its scheduler (:class:`CycleScheduler`), and the modules
  the web UI calls by name: :mod:`baselines <crawler_app.baselines>` and
  :mod:`cycle_requests <crawler_app.cycle_requests>`;
* **notifying**: the modules :mod:`channels <crawler_app.channels>` and
  :mod:`feeds <crawler_app.feeds>`;
* **import and export** of trackings: the package :mod:`porting <crawler_app.porting>`;
* **settings**: :class:`AppSettings`.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import baselines as baselines
    from . import channels as channels
    from . import cycle_requests as cycle_requests
    from . import feeds as feeds
    from . import porting as porting
    from .cycle import PageCycle as PageCycle
    from .due import Schedule as Schedule
    from .due import ScheduleError as ScheduleError
    from .due import check_schedule_of as check_schedule_of
    from .filters import FilterError as FilterError
    from .filters import ViewSpec as ViewSpec
    from .guard import FetchRefused as FetchRefused
    from .guard import check_url as check_url
    from .guard import parse_url as parse_url
    from .guard import system_resolve as system_resolve
    from .models import NAME_LENGTH as NAME_LENGTH
    from .models import WHOLE_PAGE as WHOLE_PAGE
    from .models import AppCycle as AppCycle
    from .models import Delivery as Delivery
    from .models import Notification as Notification
    from .models import Page as Page
    from .models import PageView as PageView
    from .models import Snapshot as Snapshot
    from .models import Tracking as Tracking
    from .models import User as User
    from .pages import CHECK_FAMILY as CHECK_FAMILY
    from .pages import PageError as PageError
    from .pages import add_user as add_user
    from .pages import check_password as check_password
    from .pages import check_payload as check_payload
    from .pages import check_tags as check_tags
    from .pages import family_id as family_id
    from .pages import matches as matches
    from .pages import normalise_email as normalise_email
    from .pages import page_note as page_note
    from .pages import set_password as set_password
    from .pages import set_paused as set_paused
    from .pages import set_schedule as set_schedule
    from .pages import sync_jobs as sync_jobs
    from .pages import track as track
    from .pages import trackings_of as trackings_of
    from .pages import untrack as untrack
    from .quota import QUOTAS as QUOTAS
    from .quota import Limits as Limits
    from .quota import QuotaExceeded as QuotaExceeded
    from .quota import limits_of as limits_of
    from .quota import set_quota as set_quota
    from .reach import USERS_SETTING as USERS_SETTING
    from .reach import AllowUsers as AllowUsers
    from .reach import Reach as Reach
    from .schedule import CycleScheduler as CycleScheduler
    from .schedule import MasterRunner as MasterRunner
    from .schedule import next_checks as next_checks
    from .settings import AppSettings as AppSettings

#: Public name -> (module of the package, name there; ``None``: the module itself).
_PUBLIC: dict[str, tuple[str, str | None]] = {
    # users and trackings
    "User": ("models", "User"),
    "Tracking": ("models", "Tracking"),
    "Page": ("models", "Page"),
    "PageView": ("models", "PageView"),
    "Snapshot": ("models", "Snapshot"),
    "Notification": ("models", "Notification"),
    "Delivery": ("models", "Delivery"),
    "AppCycle": ("models", "AppCycle"),
    "NAME_LENGTH": ("models", "NAME_LENGTH"),
    "WHOLE_PAGE": ("models", "WHOLE_PAGE"),
    "PageError": ("pages", "PageError"),
    "add_user": ("pages", "add_user"),
    "check_password": ("pages", "check_password"),
    "set_password": ("pages", "set_password"),
    "normalise_email": ("pages", "normalise_email"),
    "track": ("pages", "track"),
    "untrack": ("pages", "untrack"),
    "trackings_of": ("pages", "trackings_of"),
    "matches": ("pages", "matches"),
    "page_note": ("pages", "page_note"),
    "check_tags": ("pages", "check_tags"),
    "set_paused": ("pages", "set_paused"),
    "set_schedule": ("pages", "set_schedule"),
    "sync_jobs": ("pages", "sync_jobs"),
    "QuotaExceeded": ("quota", "QuotaExceeded"),
    "QUOTAS": ("quota", "QUOTAS"),
    "Limits": ("quota", "Limits"),
    "limits_of": ("quota", "limits_of"),
    "set_quota": ("quota", "set_quota"),
    # fetching
    "FetchRefused": ("guard", "FetchRefused"),
    "parse_url": ("guard", "parse_url"),
    "check_url": ("guard", "check_url"),
    "system_resolve": ("guard", "system_resolve"),
    "Reach": ("reach", "Reach"),
    "AllowUsers": ("reach", "AllowUsers"),
    "USERS_SETTING": ("reach", "USERS_SETTING"),
    # checking
    "CHECK_FAMILY": ("pages", "CHECK_FAMILY"),
    "check_payload": ("pages", "check_payload"),
    "family_id": ("pages", "family_id"),
    "ViewSpec": ("filters", "ViewSpec"),
    "FilterError": ("filters", "FilterError"),
    "Schedule": ("due", "Schedule"),
    "ScheduleError": ("due", "ScheduleError"),
    "check_schedule_of": ("due", "check_schedule_of"),
    "next_checks": ("schedule", "next_checks"),
    "CycleScheduler": ("schedule", "CycleScheduler"),
    "MasterRunner": ("schedule", "MasterRunner"),
    "PageCycle": ("cycle", "PageCycle"),
    "baselines": ("baselines", None),
    "cycle_requests": ("cycle_requests", None),
    # notifying
    "channels": ("channels", None),
    "feeds": ("feeds", None),
    # import and export
    "porting": ("porting", None),
    # settings
    "AppSettings": ("settings", "AppSettings"),
}

__all__ = [
    "CHECK_FAMILY",
    "NAME_LENGTH",
    "QUOTAS",
    "USERS_SETTING",
    "WHOLE_PAGE",
    "AllowUsers",
    "AppCycle",
    "AppSettings",
    "CycleScheduler",
    "Delivery",
    "FetchRefused",
    "FilterError",
    "Limits",
    "MasterRunner",
    "Notification",
    "Page",
    "PageCycle",
    "PageError",
    "PageView",
    "QuotaExceeded",
    "Reach",
    "Schedule",
    "ScheduleError",
    "Snapshot",
    "Tracking",
    "User",
    "ViewSpec",
    "add_user",
    "baselines",
    "channels",
    "check_password",
    "check_payload",
    "check_schedule_of",
    "check_tags",
    "check_url",
    "cycle_requests",
    "family_id",
    "feeds",
    "limits_of",
    "matches",
    "next_checks",
    "normalise_email",
    "page_note",
    "parse_url",
    "porting",
    "set_password",
    "set_paused",
    "set_quota",
    "set_schedule",
    "sync_jobs",
    "system_resolve",
    "track",
    "trackings_of",
    "untrack",
]


def __getattr__(name: str) -> Any:
    try:
        module, attr = _PUBLIC[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    loaded = import_module(f".{module}", __name__)
    value = loaded if attr is None else getattr(loaded, attr)
    globals()[name] = value  # later lookups skip this function
    return value
