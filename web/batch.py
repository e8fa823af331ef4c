"""Batches of submitted URLs: validation, the result cache, the on-demand queue, resets.

A submitted URL becomes an on-demand ``check_page`` job of the queue, keyed by
its normalised URL (with the prefix :data:`KEY_PREFIX`, so it never merges with
the job of a tracked page, which belongs to the application cycles). The job's
``done`` executions in the reconstruction log are the result cache:

* a URL whose latest good result is younger than the cache TTL is answered from
  it at once; a random share of those is queued again to refresh the cache;
* a URL whose latest result is an error is never answered from the cache: it is
  queued again and answered by the fresh result. The error may have been
  temporary or lifted (a server back up, a network allowed since): shown as a
  final "(cached)" answer it would mislead, and the batch would say "complete"
  before the URL was really tried again;
* any other URL is queued (a job already running is not queued twice: its
  result is fresh) and answered by the job's next ``done`` execution.

A reset forgets a URL's results: the cache ignores every execution of its job
up to the newest one at the time of the reset.

A job carries who asked (:class:`crawler_app.Reach`): jobs that may use the
fetch allowlist are keyed apart (:data:`KEY_PREFIXES`), so a visitor's submission
of a URL never shares the job, nor the cached results, of a user's submission
that may reach a private network.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.orm import sessionmaker

from crawler_app import CHECK_FAMILY, FetchRefused, Reach, check_payload, family_id, parse_url
from jodl.log import JobState, Reads, utcnow
from jodl.queue import Queue

from . import queries
from .models import ITEM_URL_LENGTH, Batch
from .quota import check_submission, one_at_a_time
from .settings import WebSettings

log = logging.getLogger("web.batch")

#: Prefix of the queue keys of submitted URLs (keeps them apart from tracked pages' jobs).
KEY_PREFIX = "web:"
#: The prefix by the jobs' reach: results reached through the allowlist answer only
#: submissions that may use it.
KEY_PREFIXES = {Reach.PUBLIC: KEY_PREFIX, Reach.ALLOWLIST: "web-allowlist:"}
#: Priority of submitted URLs in the on-demand queue (people are waiting for them).
PRIORITY = 10
#: Characters of the page's text sent with a result.
EXCERPT_CHARS = 300
#: Days a batch is kept (its page and stream stop working after that).
BATCH_DAYS = 7
#: Seconds between two deletions of expired batches by one process.
CLEANUP_EVERY = 3600.0


class SubmissionError(ValueError):
    """A submission refused as a whole (empty, too many URLs); the message says why."""


@dataclass
class Item:
    """One URL of a batch, as the stream and the pages see it."""

    position: int
    url: str
    error: str | None = None
    job_id: int | None = None
    cached_exec_id: int | None = None
    after_exec_id: int = 0
    previous_fingerprint: str | None = None

    @property
    def pending(self) -> bool:
        """True while the answer is a result still to come from the queue."""
        return self.error is None and self.cached_exec_id is None


@dataclass
class Submitted:
    """What :meth:`Batches.submit` did: the batch and how each URL was answered."""

    id: str
    items: list[Item]
    duplicates: int = 0
    cached: int = 0
    queued: int = 0
    refused: int = 0
    refreshed: int = 0


@dataclass
class Latest:
    """The newest results of one job above its reset floor (newest first)."""

    exec_ids: list[int] = field(default_factory=list)
    finished: list[dt.datetime | None] = field(default_factory=list)


def check_url(text: str, max_length: int) -> str:
    """The normalised form of a submitted URL, or :class:`ValueError` saying why not."""
    text = text.strip()
    if not text:
        raise ValueError("empty URL")
    if len(text) > max_length:
        raise ValueError(f"URL longer than {max_length} characters")
    try:
        normal = parse_url(text).url
    except FetchRefused as exc:
        raise ValueError(exc.message) from None
    if len(normal) > max_length:
        raise ValueError(f"URL longer than {max_length} characters")
    return normal


def split_urls(text: str) -> list[str]:
    """The URLs of a text area: one per line (blank lines skipped)."""
    return [line.strip() for line in text.splitlines() if line.strip()]


def decode(text: str | None) -> dict[str, Any] | None:
    """A stored result as a dict (None when absent or not a JSON object)."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def page_fingerprint(result: dict[str, Any] | None) -> str | None:
    """The fingerprint of the whole page's text in a ``check_page`` result."""
    if not result or not result.get("ok"):
        return None
    view = (result.get("views") or {}).get("") or {}
    fp = view.get("fingerprint")
    return fp if isinstance(fp, str) else None


def describe(
    item: Item,
    result: dict[str, Any] | None,
    *,
    cached: bool = False,
    checked_at: dt.datetime | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """The event sent for an answered item (JSON-ready, plain values only)."""
    event: dict[str, Any] = {
        "position": item.position,
        "url": item.url,
        "ok": False,
        "cached": cached,
        "status": None,
        "final_url": None,
        "title": None,
        "size": None,
        "fingerprint": None,
        "changed": None,
        "excerpt": None,
        "error": error or item.error,
        "checked_at": checked_at.isoformat(timespec="seconds") + "Z" if checked_at else None,
    }
    if result is None:
        if event["error"] is None:
            event["error"] = "no result"
        return event
    event.update(
        status=result.get("status"),
        final_url=result.get("final_url"),
        title=result.get("title"),
        size=result.get("size"),
    )
    if not result.get("ok"):
        code = result.get("error") or "error"
        message = result.get("error_message")
        event["error"] = f"{code}: {message}" if message else str(code)
        return event
    fp = page_fingerprint(result)
    view = (result.get("views") or {}).get("") or {}
    text = view.get("text")
    event.update(ok=True, fingerprint=fp)
    if isinstance(text, str):
        event["excerpt"] = text[:EXCERPT_CHARS]
    if fp is not None and item.previous_fingerprint is not None:
        event["changed"] = fp != item.previous_fingerprint
    return event


class Batches:
    """Submissions, cache look-ups, resets and result look-ups on one database."""

    def __init__(
        self,
        engine: Engine,
        settings: WebSettings,
        queue: Queue | None = None,
        rng: Callable[[], float] = random.random,
        clock: Callable[[], dt.datetime] = utcnow,
    ) -> None:
        self.engine = engine
        self.clock = clock
        self.settings = settings
        self.queue = queue or Queue(engine)
        self.sessions = sessionmaker(engine, expire_on_commit=False)
        #: The library's results and jobs, read through its public methods.
        self.log = Reads(engine)
        self.rng = rng
        self._family_id: int | None = None
        self._next_cleanup = 0.0

    # -- helpers -----------------------------------------------------------------------------

    def family_id(self) -> int:
        """Id of ``check_page`` (created idempotent, as the page checker creates it)."""
        if self._family_id is None:
            with self.sessions.begin() as s:
                self._family_id = family_id(s, CHECK_FAMILY)
        return self._family_id

    def jobs(self, urls: Sequence[str], reach: Reach = Reach.PUBLIC) -> dict[str, tuple[int, str]]:
        """url -> (job id, state) of the on-demand jobs of these normalised URLs."""
        prefix = KEY_PREFIXES[reach]
        keys = [prefix + u for u in urls]
        found = self.log.jobs_by_key(self.family_id(), keys)
        return {key[len(prefix) :]: job for key, job in found.items()}

    def _floors(self, conn: Any, job_ids: Sequence[int]) -> dict[int, int]:
        return queries.cache_floors(conn, job_ids)

    def latest(
        self, job_ids: Sequence[int], keep: int = 2
    ) -> tuple[dict[int, Latest], dict[int, int]]:
        """Per job its ``keep`` newest done executions above its reset floor; and the floors."""
        out: dict[int, Latest] = {}
        with self.engine.connect() as conn:
            floors = self._floors(conn, job_ids)
        for jid, results in self.log.latest_results(job_ids, keep).items():
            for eid, finished in results:
                if eid <= floors.get(jid, 0):
                    continue
                entry = out.setdefault(jid, Latest())
                entry.exec_ids.append(eid)
                entry.finished.append(finished)
        return out, floors

    def results(self, exec_ids: Iterable[int]) -> dict[int, dict[str, Any] | None]:
        """Decoded results of these executions."""
        return {eid: decode(text) for eid, text in self.log.result_texts(exec_ids).items()}

    # -- submit ---------------------------------------------------------------------------------

    def submit(
        self,
        urls: Sequence[str],
        user_id: int | None = None,
        admit: Callable[[str], None] | None = None,
        most: int | None = None,
        *,
        refetch: bool = False,
        reach: Reach = Reach.PUBLIC,
    ) -> Submitted:
        """:meth:`_submit`; one user's submissions one at a time in this process, so two
        at once cannot both pass the daily quota's count."""
        if user_id is None:
            return self._submit(urls, user_id, admit, most, refetch=refetch, reach=reach)
        with one_at_a_time(user_id):
            return self._submit(urls, user_id, admit, most, refetch=refetch, reach=reach)

    def _submit(
        self,
        urls: Sequence[str],
        user_id: int | None = None,
        admit: Callable[[str], None] | None = None,
        most: int | None = None,
        *,
        refetch: bool = False,
        reach: Reach = Reach.PUBLIC,
    ) -> Submitted:
        """Record a batch of URLs, answer what the cache can, queue the rest.

        ``refetch``: the cache answers nothing, every URL is fetched now ("Check now").
        ``reach``: whether the jobs may use the fetch allowlist, decided from the user
        who submits (a visitor not signed in: never); it also picks the jobs' keys.

        Raises :class:`SubmissionError` for an empty batch or one over the size limit,
        :class:`crawler_app.QuotaExceeded` for one over the user's quotas.
        Each URL refused on its own (scheme, syntax, length) becomes an item with an
        error: the rest of the batch goes ahead. ``admit`` may refuse a normalised
        URL more (ValueError saying why); ``most`` lowers the size limit.
        """
        if not isinstance(urls, Sequence) or isinstance(urls, str):
            raise SubmissionError("urls must be a list of strings")
        if not urls:
            raise SubmissionError("no URL given")
        most = min(most or self.settings.web_batch_max, self.settings.web_batch_max)
        if len(urls) > most:
            raise SubmissionError(f"{len(urls)} URLs given; at most {most} per submission")
        if user_id is not None:  # QuotaExceeded before anything is queued or written
            check_submission(self.sessions, user_id, len(urls), self.clock())
        self._cleanup()
        items: list[Item] = []
        seen: set[str] = set()
        duplicates = 0
        for text in urls:
            if not isinstance(text, str):
                items.append(Item(len(items), str(type(text).__name__), "not a string"))
                continue
            try:
                normal = check_url(text, self.settings.web_url_max)
                if admit is not None:
                    admit(normal)
            except ValueError as exc:
                # Shown as given, but storable (PostgreSQL text refuses NUL).
                shown = text.strip()[:ITEM_URL_LENGTH].replace("\x00", "\ufffd")
                items.append(Item(len(items), shown, str(exc)))
                continue
            if normal in seen:
                duplicates += 1
                continue
            seen.add(normal)
            items.append(Item(len(items), normal))
        out = Submitted(secrets.token_urlsafe(16)[:22], items, duplicates)
        out.refused = sum(1 for i in items if i.error is not None)
        accepted = [i for i in items if i.error is None]
        jobs = self.jobs([i.url for i in accepted], reach)
        known = [jid for jid, _ in jobs.values()]
        latest, floors = self.latest(known)
        needed: set[int] = set()
        for found in latest.values():
            needed.update(found.exec_ids)
        results = self.results(needed)
        now = self.clock()
        ttl = dt.timedelta(seconds=self.settings.web_cache_ttl)
        to_queue: list[Item] = []
        running: list[Item] = []
        for item in accepted:
            jid, state = jobs.get(item.url, (None, None))
            entry = latest.get(jid) if jid is not None else None
            newest = entry.exec_ids[0] if entry and entry.exec_ids else None
            newest_result = results.get(newest) if newest is not None else None
            fresh = (
                newest is not None
                and entry is not None
                and entry.finished[0] is not None
                and now - entry.finished[0] <= ttl
            )
            good = bool(newest_result and newest_result.get("ok"))
            item.job_id = jid
            # Results up to a reset's floor are forgotten: they answer nothing.
            item.after_exec_id = max(newest or 0, floors.get(jid, 0) if jid is not None else 0)
            if fresh and good and not refetch and newest is not None and entry is not None:
                item.cached_exec_id = newest
                older = entry.exec_ids[1] if len(entry.exec_ids) > 1 else None
                item.previous_fingerprint = page_fingerprint(results.get(older)) if older else None
                out.cached += 1
                if self.rng() < self.settings.web_refresh_fraction:
                    out.refreshed += 1
                    if state != JobState.CLAIMED:
                        to_queue.append(item)
                continue
            item.previous_fingerprint = page_fingerprint(newest_result)
            out.queued += 1
            if state != JobState.CLAIMED:
                to_queue.append(item)
            else:
                running.append(item)
        if running:
            # A job running now brings a fresh result anyway: it is not run twice. Unless
            # its run ended between the two looks above: then its result may be the one
            # taken as "before" (after_exec_id), and only a new run answers.
            still = self.jobs([i.url for i in running], reach)
            to_queue += [i for i in running if still.get(i.url, (0, ""))[1] != JobState.CLAIMED]
        if to_queue:
            prefix = KEY_PREFIXES[reach]
            ids = self.queue.enqueue_many(
                CHECK_FAMILY,
                [(prefix + i.url, check_payload(i.url, False, {"": []}, reach)) for i in to_queue],
                priority=PRIORITY,
            )
            for item, jid in zip(to_queue, ids, strict=True):
                item.job_id = jid
        with self.engine.begin() as conn:
            queries.insert_batch(
                conn,
                {"id": out.id, "user_id": user_id, "size": len(items), "created_at": now},
                [
                    {
                        "batch_id": out.id,
                        "position": i.position,
                        "url": i.url,
                        "error": i.error,
                        "job_id": i.job_id,
                        "cached_exec_id": i.cached_exec_id,
                        "after_exec_id": i.after_exec_id,
                        "previous_fingerprint": i.previous_fingerprint,
                    }
                    for i in items
                ],
            )
        return out

    def load(self, batch_id: str) -> tuple[Batch, list[Item]] | None:
        """A batch and its items by position, or None when there is no such batch."""
        if not isinstance(batch_id, str) or not 0 < len(batch_id) <= 32:
            return None
        with self.sessions() as s:
            found = queries.batch_with_items(s, batch_id)
            if found is None:
                return None
            batch, rows = found
            items = [
                Item(
                    r.position,
                    r.url,
                    r.error,
                    r.job_id,
                    r.cached_exec_id,
                    r.after_exec_id or 0,
                    r.previous_fingerprint,
                )
                for r in rows
            ]
        return batch, items

    # -- answers ----------------------------------------------------------------------------------

    def immediate(self, items: Iterable[Item]) -> list[dict[str, Any]]:
        """Events of items answered at submission (refused, or from the cache), by position."""
        items = [i for i in items if not i.pending]
        if not items:
            return []
        cached = self.results(i.cached_exec_id for i in items if i.cached_exec_id is not None)
        finished = self._finished([i.cached_exec_id for i in items if i.cached_exec_id])
        out = []
        for item in sorted(items, key=lambda i: i.position):
            if item.error is not None:
                out.append(describe(item, None))
            else:
                assert item.cached_exec_id is not None
                out.append(
                    describe(
                        item,
                        cached.get(item.cached_exec_id),
                        cached=True,
                        checked_at=finished.get(item.cached_exec_id),
                    )
                )
        return out

    def _finished(self, exec_ids: Sequence[int]) -> dict[int, dt.datetime | None]:
        return self.log.finished_at(exec_ids)

    def arrived(self, pending: Iterable[Item]) -> list[tuple[Item, dict[str, Any]]]:
        """Items of ``pending`` whose result is committed now, in commit order, with events.

        One query: the first ``done`` execution of each item's job above its
        ``after_exec_id``. Items sharing a floor share one condition.
        """
        by_job: dict[int, Item | None] = {i.job_id: i for i in pending if i.job_id is not None}
        if not by_job:
            return []
        floors: dict[int, list[int]] = {}
        for jid, item in by_job.items():
            assert item is not None
            floors.setdefault(item.after_exec_id, []).append(jid)
        out: list[tuple[Item, dict[str, Any]]] = []
        # Results committed together go out in the order the agents finished them.
        for _eid, jid, text, finished in self.log.results_after(floors):
            item = by_job.pop(jid, None)
            if item is None:
                continue  # a second new result of the same job: the first one answers
            out.append((item, describe(item, decode(text), checked_at=finished)))
        return out

    def given_up(self, pending: Iterable[Item]) -> list[tuple[Item, dict[str, Any]]]:
        """Items whose job died (failed too often) or was deleted: answered with the error."""
        by_job = {i.job_id: i for i in pending if i.job_id is not None}
        if not by_job:
            return []
        out = []
        for jid, state, error in self.log.given_up(by_job):
            item = by_job[jid]
            why = error or ("deleted" if state == JobState.DELETED else "failed")
            out.append((item, describe(item, None, error=f"gave up: {why}")))
        return out

    # -- reset -------------------------------------------------------------------------------------

    def reset(
        self, urls: Sequence[str], user_id: int | None = None, reach: Reach = Reach.PUBLIC
    ) -> dict[str, Any]:
        """Forget the cached results of these URLs (of the jobs of ``reach``, the
        resetting user's); what was forgotten and what was refused."""
        if not urls:
            raise SubmissionError("no URL given")
        if len(urls) > self.settings.web_batch_max:
            raise SubmissionError(
                f"{len(urls)} URLs given; at most {self.settings.web_batch_max} per reset"
            )
        refused: list[dict[str, str]] = []
        normal: list[str] = []
        for text in urls:
            if not isinstance(text, str):
                refused.append({"url": str(type(text).__name__), "error": "not a string"})
                continue
            try:
                normal.append(check_url(text, self.settings.web_url_max))
            except ValueError as exc:
                refused.append({"url": text.strip()[:200], "error": str(exc)})
        normal = list(dict.fromkeys(normal))
        jobs = self.jobs(normal, reach)
        ids = [jid for jid, _ in jobs.values()]
        forgotten: list[str] = []
        now = utcnow()
        newest = self.log.newest_exec_ids(ids) if ids else {}
        with self.engine.begin() as conn:
            floors = self._floors(conn, ids)
            rows = []
            for url in normal:
                jid = jobs.get(url, (None, None))[0]
                top = newest.get(jid) if jid is not None else None
                if jid is None or top is None or top <= floors.get(jid, 0):
                    continue
                forgotten.append(url)
                rows.append(
                    {"job_id": jid, "floor_exec_id": top, "user_id": user_id, "reset_at": now}
                )
            if rows:
                queries.replace_cache_resets(conn, rows)
        log.info("cache reset of %d URLs (%d had results)", len(normal), len(forgotten))
        return {
            "forgotten": forgotten,
            "unknown": [u for u in normal if u not in forgotten],
            "refused": refused,
        }

    # -- housekeeping ------------------------------------------------------------------------------

    def _cleanup(self) -> None:
        import time

        now = time.monotonic()
        if now < self._next_cleanup:
            return
        self._next_cleanup = now + CLEANUP_EVERY
        cutoff = utcnow() - dt.timedelta(days=BATCH_DAYS)
        with self.engine.begin() as conn:
            queries.delete_batches_before(conn, cutoff)
