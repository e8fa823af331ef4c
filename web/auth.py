"""Accounts: sign up, log in, log out; who the current user is; access checks.

Passwords are stored only as Werkzeug salted hashes (through the page checker's
user functions). A browser is identified by the signed session cookie; an API
client may instead send HTTP Basic credentials (e-mail and password) with each
request, or a bearer token from ``POST /api/tokens`` (no password hash per
request); neither needs a CSRF token since a browser never adds them on its own.

* **Revocable sessions**: a session and a token name the user's
  ``session_version``; logout and password changes raise it, which ends every
  session and token of that user at their next request.
* **Login limits**: failed logins count per client address and per (address,
  account), so guessing from one address stops while the owner, elsewhere, still
  logs in. An unknown account costs a password hash too (same answer time), and
  sign-up answers the same whether the address has an account or not.
* **Confirmed addresses**: a sign-up mails a signed link; digests go only to
  confirmed addresses.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar
from urllib.parse import urlsplit

from flask import (
    Blueprint,
    current_app,
    flash,
    g,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from itsdangerous import BadSignature, URLSafeTimedSerializer
from sqlalchemy.orm import Session
from werkzeug.exceptions import Forbidden, NotFound, TooManyRequests, Unauthorized
from werkzeug.security import check_password_hash, generate_password_hash

from crawler_app import (
    USERS_SETTING,
    AppSettings,
    FetchRefused,
    PageError,
    Reach,
    User,
    add_user,
    check_password,
    check_url,
    normalise_email,
    parse_url,
    system_resolve,
)

from . import queries
from .security import CSRF_KEY
from .services import is_api, services

bp = Blueprint("auth", __name__)

#: Shortest and longest password accepted at sign-up.
PASSWORD_MIN = 8
PASSWORD_MAX = 200
#: Seconds an API token lives (logout and password changes end it sooner).
TOKEN_SECONDS = 30 * 24 * 3600
#: Seconds a confirmation link stays good.
CONFIRM_SECONDS = 7 * 24 * 3600
#: Minutes over which failed logins count: JODL_WEB_SUBMIT_BURST (10) failures per
#: (address, account) per 15 minutes is under a thousand guesses a day from one
#: address, and a typing owner never meets it.
LOGIN_WINDOW_MINUTES = 15.0
#: Failed logins one address may make over all accounts, in multiples of the
#: per-(address, account) limit: guessing one account stops long before.
ADDRESS_LOGIN_FACTOR = 5
#: Answer to every sign-up, new address or not: nothing tells accounts apart.
SIGNUP_SENT = (
    "If the address has no account yet, it has one now: we sent a link to confirm it "
    "(digests go out once it is confirmed). Log in with your password."
)

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class CurrentUser:
    """The user a request acts for, and how it was authenticated."""

    id: int
    email: str
    is_admin: bool
    #: "session" (cookie: CSRF applies), "basic" (credentials in the request) or
    #: "token" (a bearer token from POST /api/tokens).
    via: str
    #: The families a token is scoped to (jobs in, results out of them and nothing
    #: else of the API); None: the whole account.
    families: tuple[str, ...] | None = None


def load_user() -> None:
    """Find the request's user (session cookie; on the API also HTTP Basic or a bearer
    token) into ``g.user``."""
    g.user = None
    auth = request.authorization if is_api() else None
    if auth is not None and auth.type == "basic":
        user = check_credentials(auth.username or "", auth.password or "")
        if user is None:
            raise Unauthorized("wrong e-mail or password")
        g.user = CurrentUser(user.id, user.email, bool(user.is_admin), "basic")
        return
    if auth is not None and auth.type == "bearer":
        found, families = _token_user(auth.token or "")
        if found is None:
            raise Unauthorized("the token is unknown, expired or revoked: get a new one")
        if families is not None and request.endpoint not in FAMILY_SCOPED_ENDPOINTS:
            raise Forbidden(
                f"this token is for the jobs of {', '.join(families)} only: "
                "use the account's session or another token for the rest of the API"
            )
        g.user = CurrentUser(found.id, found.email, bool(found.is_admin), "token", families)
        return
    uid, version = session.get("uid"), session.get("sv")
    if not isinstance(uid, int):
        return
    user = _user_at_version(uid, version)
    if user is None:
        session.pop("uid", None)  # deleted, logged out or the password changed since
        session.pop("sv", None)
        return
    g.user = CurrentUser(user.id, user.email, bool(user.is_admin), "session")


def current_user() -> CurrentUser | None:
    return g.get("user")


def _user_at_version(uid: object, version: object) -> User | None:
    """User ``uid`` if its session version is still ``version`` (else None: revoked)."""
    if not isinstance(uid, int) or not isinstance(version, int):
        return None
    with services().batches.sessions() as s:
        user = queries.user_by_id(s, uid)
    if user is None or user.session_version != version:
        return None
    return user


def _serializer(salt: str) -> URLSafeTimedSerializer:
    return URLSafeTimedSerializer(current_app.secret_key or "", salt=salt)


#: The API's endpoints a token scoped to families may call (web/jobs.py).
FAMILY_SCOPED_ENDPOINTS = frozenset(
    {"api.family_jobs_add", "api.family_results", "api.queue_jobs_add", "api.queue_job"}
)


def issue_token(user: CurrentUser, families: tuple[str, ...] | None = None) -> str:
    """A bearer token for ``user``, good until it expires or the user's sessions end;
    scoped to ``families`` (their jobs and results only) when given."""
    with services().batches.sessions() as s:
        found = queries.user_by_id(s, user.id)
        version = found.session_version if found is not None else -1
    data: dict[str, Any] = {"uid": user.id, "sv": version}
    if families is not None:
        data["fam"] = list(families)
    return str(_serializer("jodl-api-token").dumps(data))


def _token_user(token: str) -> tuple[User | None, tuple[str, ...] | None]:
    """The token's user (None: unknown, expired or revoked) and its families' scope."""
    try:
        data = _serializer("jodl-api-token").loads(token, max_age=TOKEN_SECONDS)
    except BadSignature:
        return None, None
    if not isinstance(data, dict):
        return None, None
    families = data.get("fam")
    scope = tuple(str(f) for f in families) if isinstance(families, list) else None
    return _user_at_version(data.get("uid"), data.get("sv")), scope


def end_sessions(user_id: int) -> None:
    """End every session and token of the user (logout, password change)."""
    with services().batches.sessions.begin() as s:
        queries.bump_session_version(s, user_id)


@functools.cache
def _dummy_hash() -> str:
    # Checked against when the account does not exist: the answer takes as long.
    return generate_password_hash("no such account, no such password")


def _too_many(wait: float, what: str) -> TooManyRequests:
    services().metrics.inc("jodl_web_rate_limited_total")
    seconds = max(1, round(wait))
    exc = TooManyRequests(f"{what}; retry in {seconds} s")
    exc.retry_after = seconds  # type: ignore[attr-defined]
    return exc


def check_credentials(email: str, password: str) -> User | None:
    """The account these credentials log in to, or None; failed attempts are counted
    (per address, per address and account) and refused with 429 past the limits."""
    try:
        account = normalise_email(email)
    except PageError:
        account = ""
    if not password or len(password) > PASSWORD_MAX:
        return None
    # Failed attempts count against the client's address, and against the (address,
    # account) pair; not against the account alone, which would let anyone lock its
    # owner out. Successful ones count nothing (API clients log in on each request).
    limits = services().limits
    where = request.remote_addr or "?"
    keys = ((limits.login_address, f"addr:{where}"), (limits.login_pair, f"{where} {account}"))
    wait = max(limiter.wait(key) for limiter, key in keys)
    if wait:
        raise _too_many(wait, "too many failed logins")
    user = None
    if account:
        with services().batches.sessions() as s:
            user = queries.user_by_email(s, account)
    if user is not None and user.password_hash:
        good = check_password(user, password)
    else:
        check_password_hash(_dummy_hash(), password)
        good = False
    if not good:
        for limiter, key in keys:
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


def address_key() -> str:
    """The client's address as a counting key (behind proxies: see JODL_WEB_PROXIES)."""
    return f"addr:{request.remote_addr or '?'}"


def client_key() -> str:
    """Who a rate limit counts against: the user, else the client's address."""
    user = current_user()
    return f"user:{user.id}" if user else address_key()


def limit(kind: str) -> None:
    """Take one token of ``kind`` for this client; 429 when the bucket is empty.

    Visitors who are not signed in draw from the smaller anonymous buckets."""
    limits = services().limits
    limiter = limits.users if current_user() is not None else limits.anonymous
    wait = limiter.take(f"{kind}:{client_key()}")
    if wait:
        raise _too_many(wait, "too many requests")


def batch_limit() -> int:
    """How many URLs this client may submit at once: the anonymous limit for a visitor
    who is not signed in (while anonymous submissions are on), else the users' one."""
    settings = services().settings
    if current_user() is None and settings.web_anonymous_submit:
        return min(settings.web_batch_max, settings.web_anonymous_batch_max)
    return settings.web_batch_max


class SubmissionRules(NamedTuple):
    """What a client's submission may hold and reach."""

    #: URLs at once at most.
    most: int
    #: Refuses a normalised URL more (ValueError saying why), or None.
    admit: Callable[[str], None] | None
    #: Whether the queued jobs may use the fetch allowlist (crawler_app.fetching.reach).
    reach: Reach


def fetch_reach() -> Reach:
    """The reach of the jobs this client queues: the allowlist only for a signed-in
    user named in ``JODL_FETCH_ALLOW_USERS``; never for a visitor who is not."""
    user = current_user()
    if user is None:
        return Reach.PUBLIC
    return services().allow_users.reach(user.email, user.is_admin)


def submission_rules() -> SubmissionRules:
    """How many URLs this client may submit at once, what else refuses a URL, and
    what its jobs may reach.

    Visitors who are not signed in: 401 when anonymous submissions are off; else
    smaller batches. Anyone whose jobs may not use the fetch allowlist: only hosts
    that resolve, here, to public addresses (the agent checks again at every hop)."""
    settings = services().settings
    user = current_user()
    if user is None and not settings.web_anonymous_submit:
        raise Unauthorized("log in to submit URLs")
    reach = fetch_reach()
    if reach is Reach.ALLOWLIST:
        return SubmissionRules(batch_limit(), None, reach)
    admit = public_only if user is None else public_only_signed_in
    return SubmissionRules(batch_limit(), admit, reach)


#: Why an anonymous visitor's URL is refused: a loopback name or an address that is not public.
NOT_PUBLIC = "not a public address: log in to check pages on private networks"
#: The same for a signed-in user not admitted to the fetch allowlist.
NOT_PUBLIC_FOR_USER = (
    f"not a public address: private networks are checked only for users named in {USERS_SETTING}"
)


def public_only(url: str) -> None:
    """For a visitor who is not signed in: ValueError unless ``url``'s host resolves
    to public addresses only (:func:`_public`)."""
    _public(url, NOT_PUBLIC)


def public_only_signed_in(url: str) -> None:
    """:func:`public_only` for a signed-in user not admitted to the fetch allowlist."""
    _public(url, NOT_PUBLIC_FOR_USER)


def _public(url: str, refusal: str) -> None:
    """ValueError(``refusal``) when ``url``'s host is a loopback name or resolves, here,
    to an address that is not public. The message never names the addresses.

    A trailing dot changes nothing (``localhost.`` is ``localhost``); names under
    ``localhost`` are loopback whatever DNS says (RFC 6761). A name that cannot be
    resolved here is left to the agent: its job may not use the fetch allowlist
    either, and the agents' DNS is the one that counts. This check is early and
    plain; the agent's guard, at every hop, is the one that holds."""
    try:
        host = parse_url(url).host.rstrip(".")
        if host == "localhost" or host.endswith(".localhost"):
            raise ValueError(refusal)
        check_url(url, resolve=lambda name, port: system_resolve(name.rstrip(".") or name, port))
    except FetchRefused as exc:
        if exc.code != "dns_error":
            raise ValueError(refusal) from None


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
    """Log ``user`` in: a fresh session (new CSRF token) under the user's session version."""
    session.clear()
    session.permanent = True
    session["uid"] = user.id
    session["sv"] = user.session_version or 0
    session.pop(CSRF_KEY, None)


def end_session() -> None:
    """Log out: this session and every other one of the user end."""
    user = current_user()
    if user is not None:
        end_sessions(user.id)
    session.clear()


def create_account(s: Session, email: str, password: str, confirm: str | None = None) -> User:
    """A new user from a sign-up; :class:`PageError` with a clear message if refused.

    Its address is unconfirmed. For an address that has an account already, the
    password is still hashed (the same time) and :class:`AccountExists` raised:
    callers answer as for a new account."""
    if not isinstance(password, str) or len(password) < PASSWORD_MIN:
        raise PageError(f"the password needs at least {PASSWORD_MIN} characters")
    if len(password) > PASSWORD_MAX:
        raise PageError(f"the password may have at most {PASSWORD_MAX} characters")
    if confirm is not None and confirm != password:
        raise PageError("the two passwords differ")
    address = normalise_email(email)
    if queries.email_taken(s, address):
        generate_password_hash(password)
        raise AccountExists(address)
    user = add_user(s, address, password)
    user.email_confirmed = False
    return user


class AccountExists(PageError):
    """A sign-up for an address that has an account (never told to the visitor)."""


def sign_up(email: str, password: str, confirm: str | None = None) -> None:
    """Create an account and mail its confirmation link; the same outcome seen from
    outside whether the address had an account. :class:`PageError` for bad input."""
    svc = services()
    try:
        with svc.batches.sessions.begin() as s:
            user = create_account(s, email, password, confirm)
            uid, address = user.id, user.email
    except AccountExists:
        return
    send_confirmation(uid, address)


def send_confirmation(uid: int, address: str) -> None:
    """Queue the mail with the link that confirms ``address`` (sent by an agent)."""
    token = _serializer("jodl-confirm").dumps({"uid": uid, "email": address})
    app = AppSettings.from_env()
    if app.app_url:
        link = app.app_url.rstrip("/") + url_for("auth.confirm", token=token)
    else:
        link = url_for("auth.confirm", token=token, _external=True)
    domain = app.mail_from.rpartition("@")[2].strip(" >") or "localhost"
    key = f"confirm-{uid}-{token[-16:]}"
    text = (
        f"Someone (we hope you) signed up to JODL with {address}.\n\n"
        f"Follow this link to confirm the address and receive digests:\n{link}\n\n"
        "If it was not you, ignore this mail: no digest goes to an unconfirmed address.\n"
    )
    payload = {
        "key": key,
        "message_id": f"<{key}@{domain}>",
        "from": app.mail_from,
        "to": address,
        "subject": "Confirm your e-mail address for JODL",
        "text": text,
        "html": None,
    }
    services().queue.enqueue("notify", key, payload)


def confirm_token(token: str) -> str:
    """Confirm the address a link names; the address, or :class:`NotFound`."""
    try:
        data = _serializer("jodl-confirm").loads(token, max_age=CONFIRM_SECONDS)
    except BadSignature:
        raise NotFound("this confirmation link is unknown or expired; sign up again") from None
    if not isinstance(data, dict) or not isinstance(data.get("email"), str):
        raise NotFound("this confirmation link is unknown or expired; sign up again")
    with services().batches.sessions.begin() as s:
        done = queries.confirm_email(s, data.get("uid"), data["email"])
    if not done:
        raise NotFound("this confirmation link is unknown or expired; sign up again")
    return str(data["email"])


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
        sign_up(email, request.form.get("password", ""), request.form.get("confirm", ""))
    except PageError as exc:
        flash(str(exc), "error")
        return render_template("signup.html", email=email[:320]), 400
    flash(SIGNUP_SENT, "ok")
    return redirect(url_for("auth.login"), 303)


@bp.route("/confirm/<token>")
def confirm(token: str) -> Any:
    address = confirm_token(token)
    flash(f"{address} is confirmed: digests will go there.", "ok")
    return redirect(url_for("tracking.pages" if current_user() else "auth.login"), 303)


@bp.route("/login", methods=["GET", "POST"])
def login() -> Any:
    target = safe_next(request.values.get("next"))
    if request.method == "GET":
        return render_template("login.html", next=target)
    email = request.form.get("email", "")
    user = check_credentials(email, request.form.get("password", ""))
    if user is None:
        flash("Wrong e-mail or password.", "error")
        return render_template("login.html", next=target, email=email[:320]), 401
    start_session(user)
    return redirect(target, 303)


@bp.route("/logout", methods=["POST"])
def logout() -> Any:
    end_session()
    flash("Logged out.", "ok")
    return redirect(url_for("ui.index"), 303)
