"""Import and export of the user's trackings (:mod:`crawler_app.porting`): urlwatch's
``urls.yaml`` or our JSON format.

The HTML views sit on the tracked pages' page: an upload form (the session's CSRF
token, as every form) and download links. The API lives under ``/api/trackings``
behind the API's guard: ``POST /api/trackings/import`` takes the file's text in a
JSON body (``{"text": "...", "format": "urlwatch"}``; JSON, as every state-changing
API request, so no other site's page can send it), and ``GET
/api/trackings/export?format=json|urlwatch`` answers the file itself.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response, flash, jsonify, redirect, request, url_for
from werkzeug.exceptions import BadRequest

from crawler_app import PageError, QuotaExceeded, baselines, porting

from .api import body_as, query_as
from .auth import CurrentUser, current_user, login_required
from .quota import QuotaRefused, refused
from .schemas import ExportQuery, TrackingsImport
from .services import Services, services

bp = Blueprint("porting", __name__)
#: Nested under the API's blueprint (web.app): ``/api/trackings``, behind its guard.
api_bp = Blueprint("porting_api", __name__, url_prefix="/trackings")

#: Each format's media type and the name a download is saved under.
DOWNLOADS = {
    "json": ("application/json", "jodl-trackings.json"),
    "urlwatch": ("application/yaml", "urls.yaml"),
}


class ImportProblems(BadRequest):
    """A file with entries that cannot be mapped, as a 400 naming each one."""

    def __init__(self, exc: porting.ImportRefused) -> None:
        super().__init__(str(exc))
        self.problems = exc.problems


def _format(value: Any, default: str | None) -> str | None:
    if value in (None, ""):
        return default
    if value not in porting.FORMATS:
        raise BadRequest(f"format: one of {', '.join(porting.FORMATS)}")
    return str(value)


def import_text(svc: Services, user: CurrentUser, text: Any, format: Any) -> dict[str, Any]:
    """Import ``text`` for ``user``, all or nothing, and queue the new pages' first
    checks; what was done, or :class:`BadRequest`/:class:`QuotaRefused` saying why not."""
    chosen = _format(format, None)
    if not isinstance(text, str) or not text.strip():
        raise BadRequest("text: the file's content (a urlwatch urls.yaml or a JODL export)")
    parsed = porting.parse(text, chosen)
    try:
        with svc.batches.sessions.begin() as s:
            report = porting.import_trackings(s, user.email, parsed)
    except porting.ImportRefused as exc:
        raise ImportProblems(exc) from None
    except QuotaExceeded as exc:
        raise refused(svc.metrics, exc) from None
    except PageError as exc:
        raise BadRequest(str(exc)) from None
    baselines.request(svc.queue, svc.engine, report.baseline_pages, svc.allow_users)
    return report.as_dict()


def export_text(svc: Services, user: CurrentUser, format: Any) -> tuple[str, str]:
    """The user's trackings as a file of ``format`` (default json) and that format."""
    chosen = _format(format, "json")
    assert chosen is not None
    with svc.batches.sessions() as s:
        return porting.export(s, user.email, chosen), chosen


def _user() -> CurrentUser:
    user = current_user()
    assert user is not None  # login_required
    return user


# -- HTML views ---------------------------------------------------------------------------------


@bp.route("/pages/export")
@login_required
def export_download() -> Any:
    text, chosen = export_text(services(), _user(), query_as(ExportQuery).format)
    mimetype, filename = DOWNLOADS[chosen]
    response = Response(text, mimetype=mimetype)
    response.headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@bp.route("/pages/import", methods=["POST"])
@login_required
def import_upload() -> Any:
    upload = request.files.get("file")
    try:
        if upload is None or not upload.filename:
            raise BadRequest("choose a file to import")
        raw = upload.read(porting.MAX_IMPORT_BYTES + 1)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise BadRequest("the file is not UTF-8 text") from None
        done = import_text(services(), _user(), text, request.form.get("format"))
    except (BadRequest, QuotaRefused) as exc:
        message = str(exc.description)
        if not message.startswith("nothing imported"):
            message = f"nothing imported: {message}"
        flash(message[0].upper() + message[1:], "error")
        return redirect(url_for("tracking.pages"), 303)
    flash(
        f"Imported: {done['added']} added, {done['updated']} updated, "
        f"{done['unchanged']} unchanged.",
        "ok",
    )
    for note in done["notes"][:10]:
        flash(f"Note: {note}", "ok")
    return redirect(url_for("tracking.pages"), 303)


# -- API ----------------------------------------------------------------------------------------


@api_bp.route("/import", methods=["POST"])
@login_required
def api_import() -> Any:
    data = body_as(TrackingsImport)
    try:
        return jsonify(import_text(services(), _user(), data.text, data.format))
    except ImportProblems as exc:
        problems = [p.as_dict() for p in exc.problems]
        answer = {"error": "bad_request", "message": exc.description, "problems": problems}
        return jsonify(answer), 400


@api_bp.route("/export")
@login_required
def api_export() -> Any:
    text, chosen = export_text(services(), _user(), query_as(ExportQuery).format)
    return Response(text, mimetype=DOWNLOADS[chosen][0])
