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
  the web UI calls by name: :mod:`baselines <crawler_app.checking.baselines>` and
  :mod:`cycle_requests <crawler_app.checking.cycle_requests>`;
* **notifying**: the modules :mod:`channels <crawler_app.notify.channels>` and
  :mod:`feeds <crawler_app.notify.feeds>`;
* **import and export** of trackings: the package :mod:`porting <crawler_app.porting>`;
* **settings**: :class:`AppSettings`.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import porting as porting
    from .checking import baselines as baselines
    from .checking import cycle_requests as cycle_requests
    from .checking.cycle import PageCycle as PageCycle
    from .checking.due import CRON_LENGTH as CRON_LENGTH
    from .checking.due import Schedule as Schedule
    from .checking.due import ScheduleError as ScheduleError
    from .checking.due import check_schedule_of as check_schedule_of
    from .checking.schedule import CycleScheduler as CycleScheduler
    from .checking.schedule import MasterRunner as MasterRunner
    from .checking.schedule import next_checks as next_checks
    from .fetching.filters import FilterError as FilterError
    from .fetching.filters import ViewSpec as ViewSpec
    from .fetching.guard import FetchRefused as FetchRefused
    from .fetching.guard import check_url as check_url
    from .fetching.guard import parse_url as parse_url
    from .fetching.guard import system_resolve as system_resolve
    from .fetching.reach import USERS_SETTING as USERS_SETTING
    from .fetching.reach import AllowUsers as AllowUsers
    from .fetching.reach import Reach as Reach
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
    from .notify import channels as channels
    from .notify import feeds as feeds
    from .porting import FORMATS as FORMATS
    from .settings import AppSettings as AppSettings
    from .users.pages import CHECK_FAMILY as CHECK_FAMILY
    from .users.pages import MAX_TAGS as MAX_TAGS
    from .users.pages import TAG_LENGTH as TAG_LENGTH
    from .users.pages import PageError as PageError
    from .users.pages import add_user as add_user
    from .users.pages import check_password as check_password
    from .users.pages import check_payload as check_payload
    from .users.pages import check_tags as check_tags
    from .users.pages import family_id as family_id
    from .users.pages import matches as matches
    from .users.pages import normalise_email as normalise_email
    from .users.pages import page_note as page_note
    from .users.pages import set_password as set_password
    from .users.pages import set_paused as set_paused
    from .users.pages import set_schedule as set_schedule
    from .users.pages import sync_jobs as sync_jobs
    from .users.pages import track as track
    from .users.pages import trackings_of as trackings_of
    from .users.pages import untrack as untrack
    from .users.quota import QUOTAS as QUOTAS
    from .users.quota import Limits as Limits
    from .users.quota import QuotaExceeded as QuotaExceeded
    from .users.quota import limits_of as limits_of
    from .users.quota import set_quota as set_quota

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
    "PageError": ("users.pages", "PageError"),
    "add_user": ("users.pages", "add_user"),
    "check_password": ("users.pages", "check_password"),
    "set_password": ("users.pages", "set_password"),
    "normalise_email": ("users.pages", "normalise_email"),
    "track": ("users.pages", "track"),
    "untrack": ("users.pages", "untrack"),
    "trackings_of": ("users.pages", "trackings_of"),
    "matches": ("users.pages", "matches"),
    "page_note": ("users.pages", "page_note"),
    "check_tags": ("users.pages", "check_tags"),
    "MAX_TAGS": ("users.pages", "MAX_TAGS"),
    "TAG_LENGTH": ("users.pages", "TAG_LENGTH"),
    "set_paused": ("users.pages", "set_paused"),
    "set_schedule": ("users.pages", "set_schedule"),
    "sync_jobs": ("users.pages", "sync_jobs"),
    "QuotaExceeded": ("users.quota", "QuotaExceeded"),
    "QUOTAS": ("users.quota", "QUOTAS"),
    "Limits": ("users.quota", "Limits"),
    "limits_of": ("users.quota", "limits_of"),
    "set_quota": ("users.quota", "set_quota"),
    # fetching
    "FetchRefused": ("fetching.guard", "FetchRefused"),
    "parse_url": ("fetching.guard", "parse_url"),
    "check_url": ("fetching.guard", "check_url"),
    "system_resolve": ("fetching.guard", "system_resolve"),
    "Reach": ("fetching.reach", "Reach"),
    "AllowUsers": ("fetching.reach", "AllowUsers"),
    "USERS_SETTING": ("fetching.reach", "USERS_SETTING"),
    # checking
    "CHECK_FAMILY": ("users.pages", "CHECK_FAMILY"),
    "check_payload": ("users.pages", "check_payload"),
    "family_id": ("users.pages", "family_id"),
    "ViewSpec": ("fetching.filters", "ViewSpec"),
    "FilterError": ("fetching.filters", "FilterError"),
    "Schedule": ("checking.due", "Schedule"),
    "CRON_LENGTH": ("checking.due", "CRON_LENGTH"),
    "ScheduleError": ("checking.due", "ScheduleError"),
    "check_schedule_of": ("checking.due", "check_schedule_of"),
    "next_checks": ("checking.schedule", "next_checks"),
    "CycleScheduler": ("checking.schedule", "CycleScheduler"),
    "MasterRunner": ("checking.schedule", "MasterRunner"),
    "PageCycle": ("checking.cycle", "PageCycle"),
    "baselines": ("checking.baselines", None),
    "cycle_requests": ("checking.cycle_requests", None),
    # notifying
    "channels": ("notify.channels", None),
    "feeds": ("notify.feeds", None),
    # import and export
    "porting": ("porting", None),
    "FORMATS": ("porting", "FORMATS"),
    # settings
    "AppSettings": ("settings", "AppSettings"),
}

__all__ = [
    "CHECK_FAMILY",
    "CRON_LENGTH",
    "FORMATS",
    "MAX_TAGS",
    "TAG_LENGTH",
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
