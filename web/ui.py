"""Pages anyone can use: submit URLs, watch a batch's results arrive, reset cached URLs."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, flash, redirect, render_template, request, url_for
from werkzeug.exceptions import NotFound

from crawler_app import QuotaExceeded

from .auth import (
    batch_limit,
    current_user,
    fetch_reach,
    limit,
    login_required,
    submission_rules,
)
from .batch import SubmissionError, split_urls
from .quota import refused
from .services import services

bp = Blueprint("ui", __name__)


def urls_from_form(field: str = "urls") -> list[str]:
    """The URLs of a form's text area (one per line)."""
    return split_urls(request.form.get(field, ""))


@bp.route("/")
def index() -> Any:
    return render_template("index.html", batch_max=batch_limit())


@bp.route("/batches", methods=["POST"])
def submit() -> Any:
    svc = services()
    user = current_user()
    if user is None and not svc.settings.web_anonymous_submit:
        flash("Log in to submit URLs.", "error")
        return redirect(url_for("auth.login", next="/"), 303)
    rules = submission_rules()
    limit("submit")
    text = request.form.get("urls", "")
    try:
        submitted = svc.batches.submit(
            split_urls(text),
            user.id if user else None,
            admit=rules.admit,
            most=rules.most,
            reach=rules.reach,
        )
    except (SubmissionError, QuotaExceeded) as exc:
        flash(str(exc), "error")
        code = 400
        if isinstance(exc, QuotaExceeded):
            code = refused(svc.metrics, exc).code or 403
        return (
            render_template("index.html", batch_max=rules.most, urls=text[:200_000]),
            code,
        )
    svc.metrics.inc("jodl_web_batches_total")
    for how in ("cached", "queued", "refused"):
        svc.metrics.inc("jodl_web_urls_total", getattr(submitted, how), answer=how)
    return redirect(url_for("ui.batch", batch_id=submitted.id), 303)


@bp.route("/batches/<batch_id>")
def batch(batch_id: str) -> Any:
    loaded = services().batches.load(batch_id)
    if loaded is None:
        raise NotFound("no such batch (batches are kept for a week)")
    found, items = loaded
    return render_template("batch.html", batch=found, items=items)


@bp.route("/reset", methods=["GET", "POST"])
@login_required
def reset() -> Any:
    svc = services()
    if request.method == "GET":
        return render_template("reset.html", batch_max=svc.settings.web_batch_max)
    user = current_user()
    try:
        outcome = svc.batches.reset(urls_from_form(), user.id if user else None, fetch_reach())
    except SubmissionError as exc:
        flash(str(exc), "error")
        return render_template("reset.html", batch_max=svc.settings.web_batch_max), 400
    svc.metrics.inc("jodl_web_cache_resets_total", len(outcome["forgotten"]))
    return render_template("reset.html", batch_max=svc.settings.web_batch_max, outcome=outcome)
