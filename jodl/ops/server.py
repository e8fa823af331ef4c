"""The operations endpoint of a master or an agent: health, metrics and profiles over HTTP.

A small threaded HTTP server (the standard library's WSGI server; prometheus_client
renders the metrics) on its own port, loopback by default (``JODL_METRICS_LISTEN``,
``JODL_AGENT_METRICS_LISTEN``), in a daemon thread beside the process's work; at most
:data:`MAX_CONNECTIONS` connections at once, each with :data:`READ_TIMEOUT` to ask:

``/healthz``        200 while the process works (the master: its log writer has not failed)
``/readyz``         200 once it does its job (the master: holds the lease, database answers)
``/metrics``        Prometheus text format (see :mod:`jodl.obs.metrics`)
``/ops/proof``      ``?nonce=HEX``: the process's role and cluster id (the database it
                    serves; an agent's once a master bound it), and a proof that it holds
                    the process's ops token (an HMAC of role, cluster and nonce), so a
                    client checks it talks to the process it means, of its own cluster,
                    before it reads or sends anything (:func:`ops_proof`)
``/debug/profile``  with ``JODL_PROFILING`` on, ``?seconds=N``: profiles every thread of
                    the live process for N seconds (yappi, wall clock) and answers a
                    pstats file. It asks for ``Authorization: Bearer OPS_TOKEN``
                    (:func:`jodl.agent.keys.ops_token`: ``JODL_OPS_TOKEN``, or derived
                    from the process's key for this purpose alone; the cluster secret
                    and node keys never go over HTTP); without any, loopback clients only.

With ``JODL_PROFILING`` on, an ops address that is taken stops the process at start:
whoever holds the port would otherwise answer in its name. Port 0 lets the system
pick a free port (``jodl up`` does so for each process); the process then publishes
the address it bound where others find it: a master in its heartbeat row, an agent
in its answer to a master's ``init`` (docs/operations.md, "Finding every endpoint").
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, make_wsgi_app

from ..agent.keys import ops_token
from ..agent.wire import split_address
from ..exceptions import JodlError

log = logging.getLogger("jodl.ops")

#: Longest profile one request may ask for (seconds): the request holds a thread that long.
MAX_PROFILE_SECONDS = 300.0
#: Longest nonce a client may send to /ops/proof (hex characters).
MAX_NONCE = 128
#: A check answers (ok, reason); reason is shown in the JSON body.
Check = Callable[[], tuple[bool, str]]


def _ok() -> tuple[bool, str]:
    return True, "ok"


#: Connections served at once (a thread each); more are closed as they arrive. Scrapers,
#: health checks and a profile need a handful; the cap keeps idle connections from
#: piling up threads beside the process's work.
MAX_CONNECTIONS = 16
#: Seconds a connection may take to send its request (and a reply to be sent): a
#: scraper sends at once, so an idle connection is closed soon and frees its thread.
READ_TIMEOUT = 5.0


class _Server(ThreadingMixIn, WSGIServer):
    """The standard library's threaded WSGI server, with at most :data:`MAX_CONNECTIONS`."""

    daemon_threads = True
    allow_reuse_address = True
    # Connections waiting to be accepted (or turned away): a burst is not left to retry.
    request_queue_size = 128

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)  # no thread for it: closed at once
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (TimeoutError, ConnectionError)):
            # A client that said nothing in time, or went away: no traceback for it.
            log.debug("ops connection from %s dropped: %s", client_address, sys.exc_info()[1])
            return
        super().handle_error(request, client_address)


class _QuietHandler(WSGIRequestHandler):
    timeout = READ_TIMEOUT  # on the connection's socket: a silent client is dropped

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        log.debug("%s - %s", self.address_string(), format % args)


def ops_proof(token: str, role: str, nonce: str, cluster: str = "") -> str:
    """What the ops endpoint of a ``role`` process of ``cluster`` holding ``token``
    answers to ``nonce``."""
    parts = (b"JODL ops endpoint 2", role.encode(), cluster.encode(), nonce.encode())
    return hmac.new(token.encode(), b"\0".join(parts), hashlib.sha256).hexdigest()


def _no_cluster() -> str:
    return ""


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Profiler:
    """One profile at a time of every thread of this process, as a pstats file."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def profile(self, seconds: float) -> bytes | None:
        """Profile for ``seconds``; None when another profile is being taken."""
        import yappi  # type: ignore[import-untyped]

        if not self._lock.acquire(blocking=False):
            return None
        try:
            yappi.clear_stats()
            yappi.set_clock_type("wall")
            yappi.start(builtins=False, profile_threads=True)
            try:
                _profiling(seconds)
            finally:
                yappi.stop()
            stats = yappi.get_func_stats()
            fd, path = tempfile.mkstemp(suffix=".pstats")
            os.close(fd)
            try:
                stats.save(path, type="pstat")
                with open(path, "rb") as fh:
                    return fh.read()
            finally:
                os.unlink(path)
                yappi.clear_stats()
        finally:
            self._lock.release()


def _profiling(seconds: float) -> None:
    """Wait while the profile is taken (a Python call of its own: a profile of an idle
    process still has one entry, and pstats cannot load an empty one)."""
    time.sleep(seconds)


class OpsApp:
    """The WSGI application of the endpoint."""

    def __init__(
        self,
        role: str,
        token: str | None,
        health: Check = _ok,
        ready: Check = _ok,
        registry: Any = REGISTRY,
        profiling: bool = False,
        cluster: Callable[[], str] = _no_cluster,
    ) -> None:
        self.role = role
        #: The cluster id of the process ("" while it knows none: an agent no master bound).
        self.cluster = cluster
        self.token = token
        self.profiling = profiling
        self.health = health
        self.ready = ready
        self.metrics = make_wsgi_app(registry)
        self.profiler = Profiler()

    def __call__(self, environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return self.metrics(environ, start)  # type: ignore[no-any-return]
        if path in ("/healthz", "/readyz"):
            ok, reason = (self.health if path == "/healthz" else self.ready)()
            body = {"status": "ok" if ok else "error", "role": self.role, "reason": reason}
            return _json(start, 200 if ok else 503, body)
        if path == "/ops/proof":
            return self._proof(environ, start)
        if path == "/debug/profile" and self.profiling:
            return self._profile(environ, start)
        if path == "/debug/profile":
            return _json(start, 404, {"error": "profiling is off here: set JODL_PROFILING"})
        return _json(start, 404, {"error": f"no such page {path!r}"})

    def _proof(self, environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        nonce = parse_qs(environ.get("QUERY_STRING", "")).get("nonce", [""])[0]
        if not 16 <= len(nonce) <= MAX_NONCE or any(c not in "0123456789abcdef" for c in nonce):
            return _json(start, 400, {"error": f"nonce: 16 to {MAX_NONCE} hex digits"})
        cluster = self.cluster()
        proof = ops_proof(self.token, self.role, nonce, cluster) if self.token else None
        return _json(start, 200, {"role": self.role, "cluster": cluster, "proof": proof})

    def _profile(self, environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        if self.token:
            given = environ.get("HTTP_AUTHORIZATION", "").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), self.token.encode()):
                return _json(start, 401, {"error": "send Authorization: Bearer OPS_TOKEN"})
        elif not _is_loopback(environ.get("REMOTE_ADDR", "")):
            return _json(start, 403, {"error": "without an ops token only loopback may profile"})
        try:
            query = parse_qs(environ.get("QUERY_STRING", ""))
            seconds = float(query.get("seconds", ["10"])[0])
            if not 0 < seconds <= MAX_PROFILE_SECONDS:
                raise ValueError
        except ValueError:
            return _json(
                start, 400, {"error": f"seconds: a number in (0, {MAX_PROFILE_SECONDS:g}]"}
            )
        data = self.profiler.profile(seconds)
        if data is None:
            return _json(start, 409, {"error": "a profile is being taken; try again later"})
        start(
            "200 OK",
            [
                ("Content-Type", "application/octet-stream"),
                ("Content-Disposition", f'attachment; filename="{self.role}.pstats"'),
                ("Content-Length", str(len(data))),
            ],
        )
        return [data]


def _json(start: Callable[..., Any], status: int, body: dict[str, Any]) -> list[bytes]:
    reasons = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden"}
    reasons |= {404: "Not Found", 409: "Conflict", 503: "Service Unavailable"}
    data = json.dumps(body).encode()
    start(f"{status} {reasons[status]}", [("Content-Type", "application/json")])
    return [data]


class OpsServer:
    """The endpoint serving in a daemon thread; :meth:`close` stops it."""

    def __init__(self, app: OpsApp, listen: str) -> None:
        host, port = split_address(listen)
        self.app = app
        self._server = make_server(
            host, port, app, server_class=_Server, handler_class=_QuietHandler
        )
        self.port = self._server.server_port
        self.address = f"{host}:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"ops-{app.role}", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def serve(
    app: OpsApp, listen: str | None, taken: int = logging.WARNING, name: str = "the ops address"
) -> OpsServer | None:
    """Serve ``app`` on ``listen``; None when off (empty) or the address is taken
    (logged at level ``taken``; :class:`JodlError` when ``app`` profiles: the holder
    of the port would answer in this process's name)."""
    if not listen:
        return None
    try:
        server = OpsServer(app, listen)
    except OSError as exc:
        why = exc.strerror or str(exc)
        if app.profiling:
            raise JodlError(
                f"{name} {listen} is taken ({why}): with JODL_PROFILING on it must be this "
                f"process's own; free it or set {name} to another address"
            ) from None
        log.log(taken, "no health/metrics endpoint on %s: %s", listen, why)
        return None
    log.info("health and metrics on http://%s/metrics", server.address)
    return server


def serve_master(master: Any, taken: int = logging.WARNING) -> OpsServer | None:
    """The endpoint of a master (``JODL_METRICS_LISTEN``), with the database's gauges.

    ``taken``: level of the message when the address is in use (``jodl run`` beside
    a long-lived master on the same host: expected, so INFO there).
    """

    from ..queue.collector import register_database

    settings = master.settings
    if not settings.metrics_listen:
        return None

    def health() -> tuple[bool, str]:
        try:
            master.writer.check()
        except BaseException as exc:  # noqa: BLE001 - reported, not raised
            return False, f"log writer stopped: {exc}"
        return True, "ok"

    def ready() -> tuple[bool, str]:
        if not master.epoch:
            return False, "no master lease yet"
        try:
            master.store.ping()
        except Exception as exc:  # noqa: BLE001 - reported, not raised
            return False, f"database: {str(exc).splitlines()[0][:200]}"
        return health()

    cluster = master.store.cluster_id()
    app = OpsApp(
        "master",
        ops_token(settings),
        health,
        ready,
        profiling=settings.profiling,
        cluster=lambda: cluster,
    )
    server = serve(app, settings.metrics_listen, taken, "JODL_METRICS_LISTEN")
    if server is not None:
        master.leadership.ops = server.address  # in its heartbeat: status and scrapers find it
        collector = register_database(master.store)
        closing = server.close

        def close() -> None:
            REGISTRY.unregister(collector)
            closing()

        server.close = close  # type: ignore[method-assign]
    return server


def serve_agent(core: Any, settings: Any) -> OpsServer | None:
    """The endpoint of an agent (``JODL_AGENT_METRICS_LISTEN``), with its queue gauges."""
    from ..agent.collector import register_agent

    if not settings.agent_metrics_listen:
        return None
    app = OpsApp(
        "agent", ops_token(settings), profiling=settings.profiling, cluster=lambda: core.cluster
    )
    server = serve(app, settings.agent_metrics_listen, name="JODL_AGENT_METRICS_LISTEN")
    if server is not None:
        core.ops_address = server.address  # told to every master in its init answer
        register_agent(core)
    return server


__all__ = ["OpsApp", "OpsServer", "Profiler", "ops_proof", "serve", "serve_agent", "serve_master"]
