"""The result of a ``check_page`` job: what the family returns and the analysis reads.

:class:`CheckResult` is made on the agent (:class:`~crawler_app.checking.families.CheckPage`)
and read on the master (:mod:`~crawler_app.checking.analysis`,
:mod:`~crawler_app.checking.baselines`). Between them it is JSON, the job's result in
the log (the web UI and the API read that JSON too), converted at the boundary by
:meth:`CheckResult.to_json` on the agent and :meth:`CheckResult.from_json` on the
master: nothing else reads or writes its keys.

The JSON, as every version of the family wrote it: the fetcher's status fields of the
last fetch (``url`` ... ``error_message``, :data:`STATUS_FIELDS`), ``browser`` (a
rendered page: the requests it made and those refused), ``redirects``, ``script_page``
(a good fetch: the page builds its text with scripts), ``views`` (a good fetch:
``{view key: {fingerprint, chars, matches, text?, truncated?, verdict, fetches,
model?}}``, ``error`` instead of the first three for a view whose filters cannot be
used) and ``fetches`` (a good fetch: how many the check made).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

#: The fetcher's status fields a check's result carries, in their JSON order.
STATUS_FIELDS = (
    "url", "final_url", "status", "ok", "not_modified", "etag", "last_modified",
    "content_type", "size", "title", "truncated", "elapsed", "error", "error_reason",
    "error_message",
)  # fmt: skip


@dataclass(frozen=True)
class ViewResult:
    """One view of the page as the check saw it (:mod:`crawler_app.checking.confirm`)."""

    #: Fingerprint and length of the view's text in the last good fetch.
    fingerprint: str | None = None
    chars: int = 0
    #: Elements the view's selector matched (None: no selector).
    matches: int | None = None
    #: The view's text: kept only for a new baseline or a change.
    text: str | None = None
    #: The text was cut at ``JODL_MAX_TEXT_CHARS``.
    truncated: bool = False
    #: ``same``, ``noise``, ``change`` or ``baseline``; None: no fetch gave the view text.
    verdict: str | None = None
    #: Good fetches of the view in this check.
    fetches: int | None = None
    #: What the fetches taught about the view's noise (``Model.to_json``), when they did.
    model: dict[str, str] | None = None
    #: Why the view's filters cannot be used (then no fingerprint, chars, matches).
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.error is not None:
            out["error"] = self.error
        else:
            out.update(fingerprint=self.fingerprint, chars=self.chars, matches=self.matches)
        if self.text is not None:
            out["text"] = self.text
        if self.truncated:
            out["truncated"] = True
        out.update(verdict=self.verdict, fetches=self.fetches)
        if self.model is not None:
            out["model"] = self.model
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ViewResult:
        fetches = data.get("fetches")
        return cls(
            fingerprint=data.get("fingerprint"),
            chars=data.get("chars") or 0,
            matches=data.get("matches"),
            text=data.get("text"),
            truncated=bool(data.get("truncated")),
            verdict=data.get("verdict") or None,
            fetches=fetches if isinstance(fetches, int) else None,
            model=data.get("model") or None,
            error=data.get("error") or None,
        )


@dataclass(frozen=True)
class CheckResult:
    """One ``check_page`` job's result (see the module doc for its JSON)."""

    url: str | None = None
    final_url: str | None = None
    status: int | None = None
    ok: bool = False
    not_modified: bool = False
    etag: str | None = None
    last_modified: str | None = None
    content_type: str | None = None
    size: int | None = None
    title: str | None = None
    truncated: bool | None = None
    elapsed: float | None = None
    error: str | None = None
    error_reason: str | None = None
    error_message: str | None = None
    #: The page was rendered in a browser: ``browser`` is in the JSON (None when the
    #: rendering did not start).
    rendered: bool = False
    #: A rendering's requests: ``{"requests": n, "refused": n, "examples": [...]}``.
    browser: dict[str, Any] | None = None
    redirects: int = 0
    #: A good fetch only (None: not judged).
    script_page: bool | None = None
    #: A good fetch only: each view by its key (``""``: the whole page).
    views: dict[str, ViewResult] | None = None
    #: A good fetch only: fetches the check made.
    fetches: int | None = None

    @classmethod
    def of_fetch(cls, fetched: dict[str, Any], *, rendered: bool = False) -> CheckResult:
        """The status fields of one fetch (the fetcher's or the renderer's result)."""
        status: dict[str, Any] = {name: fetched.get(name) for name in STATUS_FIELDS}
        status["ok"], status["not_modified"] = bool(status["ok"]), bool(status["not_modified"])
        return cls(
            **status,
            rendered=rendered,
            browser=fetched.get("browser") if rendered else None,
            redirects=len(fetched.get("redirects") or ()),
        )

    @property
    def refused_requests(self) -> int | None:
        """Requests of a rendered page that were refused (None: not rendered)."""
        if not isinstance(self.browser, dict):
            return None
        return int(self.browser.get("refused") or 0)

    def to_json(self) -> dict[str, Any]:
        """The result as the job returns it (JSON's types only)."""
        out: dict[str, Any] = {name: getattr(self, name) for name in STATUS_FIELDS}
        if self.rendered:
            out["browser"] = self.browser
        out["redirects"] = self.redirects
        if self.script_page is not None:
            out["script_page"] = self.script_page
        if self.views is not None:
            out["views"] = {key: view.to_json() for key, view in self.views.items()}
        if self.fetches is not None:
            out["fetches"] = self.fetches
        return out

    @classmethod
    def from_json(cls, data: Any) -> CheckResult:
        """A stored result; one that is not a JSON object reads as an internal error."""
        if not isinstance(data, dict):
            return cls(error="internal_error", error_message="bad result")
        views = data.get("views")
        known = {f.name for f in fields(cls)} - {"rendered", "views", "ok", "not_modified"}
        return cls(
            **{name: data[name] for name in known if data.get(name) is not None},
            ok=bool(data.get("ok")),
            not_modified=bool(data.get("not_modified")),
            rendered="browser" in data,
            views=(
                {key: ViewResult.from_json(v) for key, v in views.items() if isinstance(v, dict)}
                if isinstance(views, dict)
                else None
            ),
        )
