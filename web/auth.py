"""Accounts: sign up, log in, log out; who the current user is; access checks.

Passwords are stored only as Werkzeug salted hashes (through the page checker's
user functions). A browser is identified by the signed session cookie; an API
client may instead send HTTP Basic credentials (e-mail and password) with each
request, which needs no CSRF token since a browser never adds them on its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

from flask import Blueprint, flash, g, redirect, render_template, request, session, url_for
from sqlalchemy import select
from sqlalchemy.orm import Session
from werkzeug.exceptions import Forbidden, TooManyRequests, Unauthorized

from crawler_app.models import User
from crawler_app.pages import PageError, add_user, check_password, normalise_email

from .app import is_api, services
from .security import CSRF_KEY

bp = Blueprint("auth", __name__)

#: Shortest and longest password accepted at sign-up.
PASSWORD_MIN = 8
PASSWORD_MAX = 200

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class CurrentUser:
    """The user a request acts for, and how it was authenticated."""

    id: int
    email: str
    is_admin: bool
    #: "session" (cookie: CSRF applies) or "basic" (credentials in the request).
    via: str


def load_user() -> None:
    """Find the request's user (session cookie, or HTTP Basic on the API) into ``g.user``."""
    g.user = None
    auth = request.authorization if is_api() else None
    if auth is not None and auth.type == "basic":
        user = _check_credentials(auth.username or "", auth.password or "")
        if user is None:
            raise Unauthorized("wrong e-mail or password")
        g.user = CurrentUser(user.id, user.email, bool(user.is_admin), "basic")
        return
    uid = session.get("uid")
    if not isinstance(uid, int):
        return
    with services().batches.sessions() as s:
        user = s.get(User, uid)
    if user is None or session.get("pw") != _password_tag(user):
        session.pop("uid", None)  # deleted, or the password changed since the login
        return
    g.user = CurrentUser(user.id, user.email, bool(user.is_admin), "session")


def current_user() -> CurrentUser | None:
    return g.get("user")


def _password_tag(user: User) -> str:
    # A short tag of the hash: changing the password ends other sessions.
    return (user.password_hash or "")[-12:]


def _check_credentials(email: str, password: str) -> User | None:
    try:
        address = normalise_email(email)
    except PageError:
        return None
    if not password or len(password) > PASSWORD_MAX:
        return None
    # Failed attempts count against the address (not successful ones: API clients
    # send their credentials with every request).
    limiter = services().limiter
    key = f"login-failed:{address}"
    wait = limiter.wait(key)
    if wait:
        services().metrics.inc("jodl_web_rate_limited_total")
        exc = TooManyRequests(f"too many failed logins; retry in {max(1, round(wait))} s")
        exc.retry_after = max(1, round(wait))  # type: ignore[attr-defined]
        raise exc
    with services().batches.sessions() as s:
        user = s.scalar(select(User).where(User.email == address))
    if user is None or not check_password(user, password):
        limiter.take(key)
        return None
    return user


def login_required(view: F) -> F:
    """The view needs a logged-in user: HTML views send visitors to the login page."""

    @functools.wraps(view)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if current_user() is None:
            if is_api():
                raise Unauthorized("log in first (session) or send HTTP Basic credentials")
            return redirect(url_for("auth.login", next=request.full_path.rstrip("?")))
        return view(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def admin_required(view: F) -> F:
    """The view needs a logged-in operator (admin role)."""

    @functools.wraps(view)
    @login_required
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        user = current_user()
        if user is None or not user.is_admin:
            raise Forbidden("operators only")
        return view(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def client_key() -> str:
    """Who a rate limit counts against: the user, else the client's address."""
    user = current_user()
    return f"user:{user.id}" if user else f"addr:{request.remote_addr or '?'}"


def limit(kind: str) -> None:
    """Take one token of ``kind`` for this client; 429 when the bucket is empty."""
    wait = services().limiter.take(f"{kind}:{client_key()}")
    if wait:
        services().metrics.inc("jodl_web_rate_limited_total")
        exc = TooManyRequests(f"too many requests; retry in {max(1, round(wait))} s")
        exc.retry_after = max(1, round(wait))  # type: ignore[attr-defined]
        raise exc


def safe_next(target: str | None) -> str:
    """A same-site path to go to after logging in (anything else: the home page)."""
    if not target or not isinstance(target, str) or len(target) > 2000:
        return url_for("ui.index")
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return url_for("ui.index")
    if "\\" in target or any(ord(c) < 32 for c in target):
        return url_for("ui.index")
    return target


def start_session(user: User) -> None:
    """Log ``user`` in: a fresh session (new CSRF token) bound to the password."""
    session.clear()
    session.permanent = True
    session["uid"] = user.id
    session["pw"] = _password_tag(user)
    session.pop(CSRF_KEY, None)


def create_account(s: Session, email: str, password: str, confirm: str | None = None) -> User:
    """A new user from a sign-up; :class:`PageError` with a clear message if refused."""
    if not isinstance(password, str) or len(password) < PASSWORD_MIN:
        raise PageError(f"the password needs at least {PASSWORD_MIN} characters")
    if len(password) > PASSWORD_MAX:
        raise PageError(f"the password may have at most {PASSWORD_MAX} characters")
    if confirm is not None and confirm != password:
        raise PageError("the two passwords differ")
    return add_user(s, email, password)


# -- views --------------------------------------------------------------------------------------


@bp.route("/signup", methods=["GET", "POST"])
def signup() -> Any:
    svc = services()
    if not svc.settings.web_signup:
        raise Forbidden("sign-up is closed; ask an operator for an account")
    if request.method == "GET":
        return render_template("signup.html")
    limit("signup")
    email = request.form.get("email", "")
    try:
        with svc.batches.sessions.begin() as s:
            user = create_account(
                s, email, request.form.get("password", ""), request.form.get("confirm", "")
            )
    except PageError as exc:
        flash(str(exc), "error")
        return render_template("signup.html", email=email[:320]), 400
    start_session(user)
    flash("Welcome! Your account is ready.", "ok")
    return redirect(url_for("tracking.pages"), 303)


@bp.route("/login", methods=["GET", "POST"])
def login() -> Any:
    target = safe_next(request.values.get("next"))
    if request.method == "GET":
        return render_template("login.html", next=target)
    email = request.form.get("email", "")
    user = _check_credentials(email, request.form.get("password", ""))
    if user is None:
        flash("Wrong e-mail or password.", "error")
        return render_template("login.html", next=target, email=email[:320]), 401
    start_session(user)
    return redirect(target, 303)


@bp.route("/logout", methods=["POST"])
def logout() -> Any:
    session.clear()
    flash("Logged out.", "ok")
    return redirect(url_for("ui.index"), 303)
