"""The master-agent wire: rpyc configuration, authentication and value encoding.

Only value types cross the wire (None, bool, int, float, str, bytes and plain
tuples of them): anything else would arrive as an rpyc netref, a remote proxy
that costs a round trip per access and opens the peer's object graph.  Rich
values (payloads, results, agent info) travel as JSON strings.

Authentication happens on the raw socket before rpyc speaks, on every address
(loopback included): optional mutual TLS with a private CA (certificates carry
their role as extended key usage, serverAuth for agents and clientAuth for
masters, and the master checks the agent's name against the node's address),
the agent's banner (whether it requires a secret), then (when a secret is set) a
mutual HMAC-SHA256 challenge. Every agent requires the shared secret or TLS (it
refuses to start with neither), and a master refuses to connect without one of
them. The agent proves the secret to the master too, so a master never sends
jobs to an impostor.

The session is bound to its handshake: both sides derive one key per direction
from the secret and both nonces, and every rpyc frame after the handshake carries
an HMAC-SHA256 of (direction key; frame number, header, body) (:class:`FramedChannel`).
A peer that relayed the handshake without knowing the secret can neither inject,
alter, reorder nor replay a frame: the receiver closes the connection at the first
bad tag. With TLS alone, TLS itself binds the session.

Calls of the protocol (agent side names without the ``exposed_`` prefix):

=============  ==================================================================
``init``       (a) master id, epoch, settings JSON -> agent info JSON
``send``       (b) epoch, ((exec_id, family, payload_json), ...) -> refused tuple
``done``       (c) epoch, ack ids, limit -> ((exec_id, duration, finished, result_json), ...)
``failed``     (d) epoch, ack ids, limit -> ((exec_id, duration, finished, error, retryable), ...)
``remaining``  (e) epoch -> (queued, running, held_done, held_failed)
``take_back``  (f) epoch, count, ids -> exec ids handed back unstarted
``ack``        epoch, ids -> number forgotten (results the master committed)
``cancel``     epoch, ids -> ids cancelled
``held``       epoch, ids -> subset of ids the agent still knows (after a master restart)
``ping``       -> (agent name, epoch, unix time)
``families``   -> ((name, version, is_async), ...)
=============  ==================================================================
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import socket
import ssl
import struct
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import rpyc
from rpyc.core.channel import Channel  # type: ignore[import-untyped]
from rpyc.core.stream import SocketStream
from rpyc.lib import spawn  # type: ignore[import-untyped]
from rpyc.utils.authenticators import AuthenticationError
from rpyc.utils.server import ThreadedServer  # type: ignore[import-untyped]

from .config import Settings, check_secret
from .exceptions import AuthError, BadPayload, ConfigError

#: Bumped on any incompatible change of the calls above.
PROTOCOL_VERSION = 2
_MAGIC = b"JODL%d" % PROTOCOL_VERSION
_NONCE_BYTES = 32
#: Where the authenticator hands the session's frame keys to the server (never logged).
_KEYS = "_frame_keys"
#: Banner flags: the agent requires the shared secret, or it relies on TLS alone.
_SECRET, _TLS_ONLY = b"S", b"T"

#: rpyc protocol configuration shared by both sides: nothing but exposed_ methods.
STRICT_CONFIG: dict[str, Any] = {
    "allow_public_attrs": False,
    "allow_all_attrs": False,
    "allow_pickle": False,
    "allow_getattr": True,  # needed for exposed_ names; everything else is refused
    "allow_setattr": False,
    "allow_delattr": False,
    "allow_exposed_attrs": True,
    "instantiate_custom_exceptions": False,
    "import_custom_exceptions": False,
    "include_local_traceback": False,
    "include_local_version": False,
    "propagate_SystemExit_locally": False,
    "propagate_KeyboardInterrupt_locally": False,
}

VALUE_TYPES = (type(None), bool, int, float, str, bytes)


def check_value(value: Any) -> Any:
    """Return ``value`` if it is a wire value (scalars and plain tuples); raise TypeError."""
    if type(value) is tuple:
        for item in value:
            check_value(item)
        return value
    if type(value) in VALUE_TYPES:
        return value
    raise TypeError(f"{type(value).__name__} may not cross the wire (netref); encode it")


def dumps(value: Any) -> str:
    """JSON-encode a payload or result (compact); :class:`BadPayload` if it is not JSON."""
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise BadPayload(f"not JSON-serialisable: {exc}") from None


def loads_object(text: str, what: str = "payload") -> dict[str, Any]:
    """Decode a JSON object; :class:`BadPayload` naming ``what`` otherwise."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise BadPayload(f"{what} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise BadPayload(f"{what} must be a JSON object, got {type(value).__name__}")
    return value


# --- authentication ----------------------------------------------------------------


class _Deadline:
    """One deadline for a whole handshake: every socket operation gets what is left of it.

    A per-operation timeout alone lets a peer that drips a byte now and then hold a
    thread for as long as it likes.
    """

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def arm(self, sock: socket.socket) -> None:
        left = self.end - time.monotonic()
        if left <= 0:
            raise TimeoutError("the handshake took too long")
        sock.settimeout(left)


def _recv_exact(sock: socket.socket, size: int, deadline: _Deadline) -> bytes:
    data = b""
    while len(data) < size:
        deadline.arm(sock)
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise AuthenticationError("peer closed the connection during the handshake")
        data += chunk
    return data


def _send_all(sock: socket.socket, data: bytes, deadline: _Deadline) -> None:
    deadline.arm(sock)
    sock.sendall(data)


def _mac(secret: str, label: bytes, agent_nonce: bytes, master_nonce: bytes) -> bytes:
    """HMAC-SHA256 under the secret of the label (a role or a key's name) and both nonces."""
    message = _MAGIC + label + b"\0" + agent_nonce + master_nonce
    return hmac.new(secret.encode(), message, hashlib.sha256).digest()


#: (master-to-agent, agent-to-master) frame keys of one session.
SessionKeys = tuple[bytes, bytes]


def _session_keys(secret: str, agent_nonce: bytes, master_nonce: bytes) -> SessionKeys:
    return (
        _mac(secret, b"frames master->agent", agent_nonce, master_nonce),
        _mac(secret, b"frames agent->master", agent_nonce, master_nonce),
    )


class FrameAuthError(EOFError):
    """A frame's tag is wrong: rpyc closes the connection (it treats EOFError so)."""


#: Longest frame body accepted (compressed bytes): bounds what an unauthenticated
#: header can make the receiver buffer before its tag is checked.
MAX_FRAME = 256 * 1024 * 1024
_TAG = 32
_FRAME_HEADER = Channel.FRAME_HEADER  # (!LB) body length, compressed flag
_SEQ = struct.Struct("!Q")


class FramedChannel(Channel):
    """An rpyc :class:`~rpyc.core.channel.Channel` whose every frame is authenticated.

    On the wire: rpyc's header (length, compressed flag), the body, then a 32-byte
    HMAC-SHA256 tag over the frame's number in its direction (counted by both sides,
    never sent), the header and the body. A wrong tag raises :class:`FrameAuthError`
    (an EOFError) and rpyc closes the connection. rpyc sends and receives under its
    own locks, so the counters need none. Cost: one HMAC over each frame (measured:
    about 1 µs for a small call, 1–3 µs more per KB of batch; no difference in
    ``bench/throughput.py`` beyond its noise).
    """

    __slots__ = ("_send_mac", "_recv_mac", "_send_seq", "_recv_seq")

    def __init__(self, stream: Any, send_key: bytes, recv_key: bytes) -> None:
        super().__init__(stream)
        self._send_mac = hmac.new(send_key, digestmod=hashlib.sha256)
        self._recv_mac = hmac.new(recv_key, digestmod=hashlib.sha256)
        self._send_seq = 0
        self._recv_seq = 0

    def send(self, data: bytes) -> None:
        flag = 0
        if self.compress and len(data) > self.COMPRESSION_THRESHOLD:
            data, flag = zlib.compress(data, self.COMPRESSION_LEVEL), 1
        header = _FRAME_HEADER.pack(len(data), flag)
        mac = self._send_mac.copy()
        mac.update(_SEQ.pack(self._send_seq) + header)
        mac.update(data)
        self._send_seq += 1
        self.stream.write(header + data + mac.digest())

    def recv(self) -> bytes:
        header = self.stream.read(_FRAME_HEADER.size)
        length, flag = _FRAME_HEADER.unpack(header)
        if length > MAX_FRAME:
            raise FrameAuthError(f"frame of {length} bytes refused (at most {MAX_FRAME})")
        body = self.stream.read(length + _TAG)
        data, tag = body[:length], body[length:]
        mac = self._recv_mac.copy()
        mac.update(_SEQ.pack(self._recv_seq) + header)
        mac.update(data)
        if not hmac.compare_digest(mac.digest(), tag):
            raise FrameAuthError("frame authentication failed: not from the authenticated peer")
        self._recv_seq += 1
        return zlib.decompress(data) if flag else data


# --- certificate roles -------------------------------------------------------------------
#
# A certificate says which role it may play through its extended key usage: serverAuth
# for agents (they serve), clientAuth for masters (they connect). OpenSSL refuses a
# certificate whose extended key usage names only the other role; one without any
# would pass for both, so it is refused here.

_EKU_EXTENSION = b"\x06\x03\x55\x1d\x25"  # OID 2.5.29.37, extKeyUsage
SERVER_AUTH = b"\x2b\x06\x01\x05\x05\x07\x03\x01"  # 1.3.6.1.5.5.7.3.1
CLIENT_AUTH = b"\x2b\x06\x01\x05\x05\x07\x03\x02"  # 1.3.6.1.5.5.7.3.2


def _der_item(der: bytes, at: int) -> tuple[int, int, int]:
    """(tag, start of the value, end of the value) of the DER item at ``at``."""
    tag, size = der[at], der[at + 1]
    at += 2
    if size & 0x80:
        count = size & 0x7F
        size = int.from_bytes(der[at : at + count], "big")
        at += count
    if at + size > len(der):
        raise ValueError("truncated DER")
    return tag, at, at + size


def extended_key_usages(der: bytes) -> set[bytes] | None:
    """The extended key usage OIDs (DER values) of a DER certificate; None without any."""
    at = der.find(_EKU_EXTENSION)
    while at >= 0:
        try:
            pos = at + len(_EKU_EXTENSION)
            tag, start, end = _der_item(der, pos)
            if tag == 0x01:  # critical flag
                tag, start, end = _der_item(der, end)
            if tag == 0x04:  # OCTET STRING holding SEQUENCE OF OID
                tag, start, end = _der_item(der, start)
                if tag == 0x30:
                    usages, pos = set(), start
                    while pos < end:
                        tag, value, pos = _der_item(der, pos)
                        if tag != 0x06:
                            raise ValueError("not an OID")
                        usages.add(der[value:pos])
                    return usages
        except (IndexError, ValueError):
            pass
        at = der.find(_EKU_EXTENSION, at + 1)
    return None


def _check_role(der: bytes | None, usage: bytes, peer: str) -> None:
    """AuthenticationError unless the peer's certificate names its role ``usage``."""
    usages = extended_key_usages(der or b"")
    role = "serverAuth" if usage == SERVER_AUTH else "clientAuth"
    if usages is None or usage not in usages:
        raise AuthenticationError(
            f"the {peer}'s certificate does not carry the {role} extended key usage "
            "(agents need serverAuth, masters clientAuth)"
        )


def _server_tls(settings: Settings) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(settings.tls_cert or "", settings.tls_key)
    ctx.load_verify_locations(settings.tls_ca)
    ctx.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: the master must show a CA-signed cert
    return ctx


def _client_tls(settings: Settings) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(settings.tls_cert or "", settings.tls_key)
    ctx.load_verify_locations(settings.tls_ca)
    # The agent's certificate must name the node's address (a DNS name or an IP
    # address in its subject alternative names): a certificate of the CA issued
    # to another node does not pass for this one.
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _tls_handshake(
    ctx: ssl.SSLContext, sock: socket.socket, deadline: _Deadline, **kwargs: Any
) -> ssl.SSLSocket:
    tls = ctx.wrap_socket(sock, do_handshake_on_connect=False, **kwargs)
    deadline.arm(tls)
    tls.do_handshake()  # bounded as a whole by the socket's timeout
    return tls


def require_auth(settings: Settings, what: str) -> None:
    """:class:`AuthError` (one line) unless ``settings`` authenticate peers: secret or TLS."""
    if not (settings.secret or settings.tls):
        raise AuthError(
            f"{what} without authentication: set JODL_SECRET (the same on masters and agents; "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))') "
            "or JODL_TLS_CERT/JODL_TLS_KEY/JODL_TLS_CA"
        )
    try:
        check_secret(settings.secret)
    except ConfigError as exc:
        raise AuthError(str(exc)) from None


def server_authenticator(settings: Settings) -> Callable[[socket.socket], tuple[Any, Any]]:
    """The agent's rpyc authenticator for ``settings``.

    Every connection starts with the agent's banner (magic, whether a secret is
    required, a nonce), so a master learns at once and for sure what the agent
    expects: a master without the secret, or with a secret the agent lacks, fails
    with a clear :class:`AuthError` instead of a timeout. The whole handshake has
    one deadline (``JODL_HANDSHAKE_TIMEOUT``).
    """
    require_auth(settings, "refusing to serve")
    tls = _server_tls(settings) if settings.tls else None
    secret = settings.secret
    timeout = settings.handshake_timeout

    def authenticate(sock: socket.socket) -> tuple[Any, Any]:
        deadline = _Deadline(timeout)
        credentials: dict[str, Any] = {}
        try:
            if tls is not None:
                sock = _tls_handshake(tls, sock, deadline, server_side=True)
                der = sock.getpeercert(binary_form=True)  # type: ignore[attr-defined]
                _check_role(der, CLIENT_AUTH, "master")
                credentials["cert"] = sock.getpeercert()  # type: ignore[attr-defined]
            nonce = os.urandom(_NONCE_BYTES)
            _send_all(sock, _MAGIC + (_SECRET if secret else _TLS_ONLY) + nonce, deadline)
            if secret:
                # The magic first: a peer that does not speak JODL is dropped at once
                # instead of holding this thread until the handshake's deadline.
                if _recv_exact(sock, len(_MAGIC), deadline) != _MAGIC:
                    raise AuthenticationError("protocol mismatch")
                answer = _recv_exact(sock, 32 + _NONCE_BYTES, deadline)
                proof, master_nonce = answer[:32], answer[32:]
                if not hmac.compare_digest(proof, _mac(secret, b"master", nonce, master_nonce)):
                    raise AuthenticationError("bad secret")
                _send_all(sock, _mac(secret, b"agent", nonce, master_nonce), deadline)
                credentials["secret"] = True
                to_agent, to_master = _session_keys(secret, nonce, master_nonce)
                credentials[_KEYS] = (to_master, to_agent)  # (send, receive) of the agent
        except (OSError, ssl.SSLError) as exc:
            raise AuthenticationError(f"handshake failed: {exc}") from None
        sock.settimeout(None)
        return sock, credentials

    return authenticate


class GuardedServer(ThreadedServer):
    """rpyc's ThreadedServer with authentication on and a cap on unfinished handshakes.

    At most ``JODL_HANDSHAKE_LIMIT`` connections may sit in the handshake at once
    (each has ``JODL_HANDSHAKE_TIMEOUT`` for all of it); a connection beyond that is
    closed as soon as it is accepted, without a thread: slow or silent peers cannot
    pile up threads on the agent.
    """

    def __init__(self, service: Any, settings: Settings, **kwargs: Any) -> None:
        authenticate = server_authenticator(settings)
        super().__init__(service, authenticator=authenticate, **kwargs)
        self._handshake_limit = settings.handshake_limit
        self._in_handshake = threading.BoundedSemaphore(settings.handshake_limit)
        #: Sockets holding a handshake slot (set.remove is atomic: one release each).
        self._holding: set[socket.socket] = set()
        self._turned_away = 0

        def bounded(sock: socket.socket) -> tuple[Any, Any]:
            try:
                return authenticate(sock)
            finally:
                self._end_handshake(sock)

        self.authenticator = bounded

    def _end_handshake(self, sock: socket.socket) -> None:
        try:
            self._holding.remove(sock)
        except KeyError:
            return  # released already
        self._in_handshake.release()

    def _serve(self, sock: socket.socket) -> None:
        # The slot is released after the handshake, or here if the connection ended
        # before the authenticator ran (rpyc asks for the peer's name first, which
        # fails on a connection already reset).
        try:
            self._authenticate_and_serve_client(sock)
        finally:
            self._end_handshake(sock)

    def _serve_client(self, sock: socket.socket, credentials: dict[str, Any] | None) -> None:
        # rpyc's own version logs the credentials and builds a plain channel.
        keys = credentials.pop(_KEYS, None) if credentials else None
        addrinfo = sock.getpeername()
        self.logger.info("welcome %s", addrinfo)
        try:
            config = dict(
                self.protocol_config,
                credentials=credentials,
                endpoints=(sock.getsockname(), addrinfo),
                logger=self.logger,
            )
            conn = self.service._connect(open_channel(sock, keys), config)
            self._handle_connection(conn)
        finally:
            self.logger.info("goodbye %s", addrinfo)

    def _accept_method(self, sock: socket.socket) -> None:
        if not self._in_handshake.acquire(blocking=False):
            self._turned_away += 1
            if self._turned_away in (1, 10, 100) or self._turned_away % 1000 == 0:
                self.logger.warning(
                    "%d connection(s) closed at once: %s peers already in the handshake "
                    "(JODL_HANDSHAKE_LIMIT)", self._turned_away, self._handshake_limit
                )
            self.clients.discard(sock)
            try:
                sock.close()
            except OSError:
                pass
            return
        self._holding.add(sock)
        try:
            spawn(self._serve, sock)
        except BaseException:
            self._end_handshake(sock)
            raise


def client_handshake(
    sock: socket.socket, settings: Settings, host: str
) -> tuple[socket.socket, SessionKeys | None]:
    """Run the master's side of the handshake on a connected socket.

    Returns the socket to use (TLS-wrapped or not) and the session's frame keys
    (master-to-agent, agent-to-master), None with TLS alone.
    """
    # A hung agent accepts connections (the kernel does) but never greets: it must not
    # hold the master's single thread longer than any other call would.
    deadline = _Deadline(min(settings.handshake_timeout, settings.call_timeout))
    try:
        if settings.tls:
            sock = _tls_handshake(_client_tls(settings), sock, deadline, server_hostname=host)
            der = sock.getpeercert(binary_form=True)  # type: ignore[attr-defined]
            try:
                _check_role(der, SERVER_AUTH, "agent")
            except AuthenticationError as exc:
                raise AuthError(f"{host}: {exc}; check JODL_TLS_*") from None
        # With TLS 1.3 a refused client certificate only shows on this first read.
        banner = _recv_exact(sock, len(_MAGIC) + 1 + _NONCE_BYTES, deadline)
        if banner[: len(_MAGIC)] != _MAGIC:
            raise AuthError(f"{host}: not a JODL agent of protocol {PROTOCOL_VERSION}")
        mode, nonce = banner[len(_MAGIC) : len(_MAGIC) + 1], banner[len(_MAGIC) + 1 :]
        if mode == _SECRET and not settings.secret:
            raise AuthError(f"{host}: the agent requires the shared secret; set JODL_SECRET")
        if mode != _SECRET and settings.secret:  # an agent that relies on TLS alone
            raise AuthError(
                f"{host}: the agent has no shared secret and cannot prove who it is; "
                "set the same JODL_SECRET on the agent"
            )
        keys: SessionKeys | None = None
        if settings.secret:
            secret, my_nonce = settings.secret, os.urandom(_NONCE_BYTES)
            proof = _mac(secret, b"master", nonce, my_nonce)
            _send_all(sock, _MAGIC + proof + my_nonce, deadline)
            answer = _recv_exact(sock, 32, deadline)
            if not hmac.compare_digest(answer, _mac(secret, b"agent", nonce, my_nonce)):
                raise AuthError(f"{host}: the agent does not know the shared secret")
            keys = _session_keys(secret, nonce, my_nonce)  # (send, receive) of the master
    except AuthenticationError as exc:
        hint = "JODL_SECRET and JODL_TLS_* (certificate role and name)" if settings.tls else (
            "JODL_SECRET"
        )
        raise AuthError(f"{host}: authentication failed ({exc}); check {hint}") from None
    except ssl.SSLError as exc:
        detail = getattr(exc, "verify_message", None) or exc.reason or exc
        raise AuthError(f"{host}: TLS handshake failed ({detail}); check JODL_TLS_*") from None
    except (ConnectionResetError, BrokenPipeError) as exc:
        raise AuthError(
            f"{host}: the agent closed the connection during the handshake ({exc}); "
            "check JODL_SECRET and JODL_TLS_*"
        ) from None
    sock.settimeout(None)
    return sock, keys


def open_channel(sock: socket.socket, keys: SessionKeys | None) -> Channel:
    """rpyc's channel over ``sock``: frame-authenticated when the handshake gave ``keys``."""
    stream = SocketStream(sock)
    return FramedChannel(stream, *keys) if keys else Channel(stream)


def split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {address!r}")
    return host, int(port)


def connect(address: str, settings: Settings, timeout: float | None = None) -> rpyc.Connection:
    """Open an authenticated rpyc connection to the agent at ``address`` (HOST:PORT)."""
    require_auth(settings, f"refusing to connect to {address}")
    host, port = split_address(address)
    sock = socket.create_connection((host, port), timeout=timeout or settings.call_timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    try:
        sock, keys = client_handshake(sock, settings, host)
    except BaseException:
        sock.close()
        raise
    config = dict(STRICT_CONFIG, sync_request_timeout=settings.call_timeout)
    return rpyc.connect_channel(open_channel(sock, keys), rpyc.VoidService, config=config)


def is_loopback(host: str) -> bool:
    """True when ``host`` only binds loopback."""
    if host in ("localhost",):
        return True
    try:
        import ipaddress

        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --- framed batches ------------------------------------------------------------------
#
# The hot calls (send, done, failed, acks) may carry a whole batch as ONE str instead
# of a tuple of tuples: a line per item, tab-separated fields, the JSON payload or
# result embedded last. It is still a value type, and rpyc's serializer then handles
# one string instead of several objects per job (measured: about 25 µs per job less
# across both sides). Compact JSON has no raw tab or newline, so lines split safely.


def _one_line(json_text: str) -> str:
    if "\n" in json_text or "\t" in json_text or "\r" in json_text:
        return json.dumps(json.loads(json_text), separators=(",", ":"))
    return json_text


def encode_jobs(jobs: Any) -> str:
    """(exec_id, family, payload_json) items as one framed string."""
    return "".join(f"{e}\t{f}\t{_one_line(p)}\n" for e, f, p in jobs)


def decode_jobs(text: str) -> list[tuple[int, str, str]]:
    out = []
    for line in text.split("\n"):
        if line:
            exec_id, family, payload = line.split("\t", 2)
            out.append((int(exec_id), family, payload))
    return out


def encode_done(rows: Any) -> str:
    """(exec_id, duration, finished, result_json) items as one framed string, by column.

    Line 1: the execution ids, line 2 the durations, line 3 the finish times (comma
    separated); then one result per line. Columns decode with C-speed ``map``
    instead of one split per item: this is the hottest message of the protocol.
    """
    if not rows:
        return ""
    ids, durations, finished, results = zip(*rows, strict=True)
    return "\n".join(
        (
            ",".join(map(str, ids)),
            ",".join(map(repr, durations)),
            ",".join(map(repr, finished)),
            *results,
        )
    )


def decode_done(text: str) -> list[tuple[int, float, float, str]]:
    if not text:
        return []
    lines = text.split("\n")
    ids = lines[0].split(",")
    if len(lines) != len(ids) + 3:
        raise ValueError("malformed done batch: one result per execution expected")
    return list(
        zip(
            map(int, ids),
            map(float, lines[1].split(",")),
            map(float, lines[2].split(",")),
            lines[3:],
            strict=True,
        )
    )


def encode_failed(rows: Any) -> str:
    """(exec_id, duration, finished, error, retryable) items as one framed string."""
    return "".join(
        f"{e}\t{d!r}\t{t!r}\t{int(bool(r))}\t{json.dumps(err)}\n" for e, d, t, err, r in rows
    )


def decode_failed(text: str) -> list[tuple[int, float, float, str, bool]]:
    out = []
    for line in text.split("\n"):
        if line:
            exec_id, duration, finished, retryable, error = line.split("\t", 4)
            out.append((int(exec_id), float(duration), float(finished), json.loads(error),
                        retryable == "1"))
    return out


def encode_ids(ids: Any) -> str:
    return ",".join(map(str, ids))


def decode_ids(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",")) if text else ()


# --- replies: every value an agent returns is checked before the master uses it ----------
#
# A faulty or compromised agent must not crash the master nor slip a netref, a NaN
# or a non-JSON result into the log: a reply of the wrong type or shape raises
# :class:`BadReply`, and the master treats the node as faulty (unreachable).


class BadReply(ValueError):
    """An agent's reply is not of the type and shape its call defines."""


def _finite(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def _int_tuple(value: Any) -> tuple[int, ...]:
    if type(value) is not tuple or any(type(v) is not int for v in value):
        raise BadReply(f"a plain tuple of ints expected, got {_kind(value)}")
    return value


def _kind(value: Any) -> str:
    return type(value).__name__ if type(value) in (*VALUE_TYPES, tuple) else "a netref/object"


def check_done(value: Any) -> list[tuple[int, float, float, str]]:
    """Decode and check a ``done`` reply (framed str or tuple): ids, finite times, JSON results."""
    if type(value) is str:
        # The framed batch decodes by column to ints, floats and strs already: what
        # is left to check runs at C speed but the JSON of each result.
        try:
            rows: Any = decode_done(value)
        except ValueError as exc:
            raise BadReply(f"malformed done batch ({exc})") from None
        if rows:
            _, durations, finished, results = zip(*rows, strict=True)
            if not (
                all(map(math.isfinite, durations))
                and all(map(math.isfinite, finished))
                and min(durations) >= 0
            ):
                raise BadReply("done: durations and finish times must be finite, durations >= 0")
            _check_json(results, rows)
        return rows  # type: ignore[no-any-return]
    if type(value) is not tuple:
        raise BadReply(f"done: a str or tuple expected, got {_kind(value)}")
    for row in value:
        if (
            type(row) is not tuple
            or len(row) != 4
            or type(row[0]) is not int
            or not (_finite(row[1]) and _finite(row[2]) and row[1] >= 0)
            or type(row[3]) is not str
        ):
            raise BadReply("done: rows of (int, duration, finish time, result JSON) expected")
    _check_json([row[3] for row in value], value)
    return list(value)


_json_decode = json.JSONDecoder().decode


def _check_json(results: Any, rows: Any) -> None:
    try:
        for _ in map(_json_decode, results):
            pass
    except ValueError:
        bad = next(i for i, r in enumerate(results) if not _is_json(r))
        raise BadReply(f"done: the result of execution {rows[bad][0]} is not JSON") from None


def _is_json(text: str) -> bool:
    try:
        _json_decode(text)
    except ValueError:
        return False
    return True


def check_failed(value: Any) -> list[tuple[int, float, float, str, bool]]:
    """Decode and check a ``failed`` reply (framed str or tuple)."""
    if type(value) is str:
        try:
            rows: Any = decode_failed(value)
        except ValueError as exc:
            raise BadReply(f"malformed failed batch ({exc})") from None
    elif type(value) is tuple:
        rows = value
    else:
        raise BadReply(f"failed: a str or tuple expected, got {_kind(value)}")
    for row in rows:
        if (
            type(row) is not tuple
            or len(row) != 5
            or type(row[0]) is not int
            or not (_finite(row[1]) and _finite(row[2]) and row[1] >= 0)
            or type(row[3]) is not str
            or type(row[4]) is not bool
        ):
            raise BadReply("failed: rows of (int, duration, time, error, retryable) expected")
    return list(rows)


def _check_refused(value: Any) -> Any:
    if type(value) is not tuple or any(
        type(r) is not tuple or len(r) != 2 or type(r[0]) is not int or type(r[1]) is not str
        for r in value
    ):
        raise BadReply(f"send: a tuple of (int, str) expected, got {_kind(value)}")
    return value


def _check_remaining(value: Any) -> Any:
    if len(_int_tuple(value)) != 4 or any(v < 0 for v in value):
        raise BadReply("remaining: four counts expected")
    return value


def _check_ping(value: Any) -> Any:
    if (
        type(value) is not tuple
        or len(value) != 3
        or type(value[0]) is not str
        or type(value[1]) is not int
        or not _finite(value[2])
    ):
        raise BadReply("ping: (name, epoch, time) expected")
    return value


def _check_families(value: Any) -> Any:
    if type(value) is not tuple or any(
        type(f) is not tuple
        or len(f) != 3
        or type(f[0]) is not str
        or type(f[1]) is not str
        or type(f[2]) is not bool
        for f in value
    ):
        raise BadReply("families: a tuple of (name, version, is_async) expected")
    return value


def _check_count(value: Any) -> Any:
    if type(value) is not int or value < 0:
        raise BadReply(f"a count expected, got {_kind(value)}")
    return value


def check_info(value: Any) -> dict[str, Any]:
    """Decode and check the agent info ``init`` returns (a JSON object; known keys typed)."""
    if type(value) is not str:
        raise BadReply(f"init: a JSON str expected, got {_kind(value)}")
    try:
        info = loads_object(value, "agent info")
    except BadPayload as exc:
        raise BadReply(f"init: {exc}") from None
    expected: dict[str, tuple[type, ...]] = {
        "name": (str,),
        "slots": (int,),
        "async_slots": (int,),
        "speed": (int, float),
        "epoch": (int,),
        "event_loop": (str,),
        "families": (dict,),
        "session": (int,),
        "queued": (list,),
    }
    for key, types in expected.items():
        if key in info and (type(info[key]) not in types):
            raise BadReply(f"init: {key!r} of the agent info has the wrong type")
    if any(type(i) is not int for i in info.get("queued", ())):
        raise BadReply("init: 'queued' of the agent info holds a non-integer id")
    if info.get("slots", 1) < 1 or info.get("async_slots", 0) < 0:
        raise BadReply("init: slot counts out of range")
    if "speed" in info and not (math.isfinite(info["speed"]) and info["speed"] > 0):
        raise BadReply("init: speed out of range")
    for name, fam in info.get("families", {}).items():
        if (
            type(fam) is not dict
            or type(fam.get("version", "")) is not str
            or type(fam.get("async", False)) is not bool
        ):
            raise BadReply(f"init: family {name!r} of the agent info is malformed")
    return info


#: Checks of the calls' replies (``done`` and ``failed`` decode too: see :func:`check_done`).
REPLY_CHECKS: dict[str, Callable[[Any], Any]] = {
    "send": _check_refused,
    "done": check_done,
    "failed": check_failed,
    "remaining": _check_remaining,
    "take_back": _int_tuple,
    "ack": _check_count,
    "cancel": _int_tuple,
    "held": _int_tuple,
    "ping": _check_ping,
    "families": _check_families,
}
