"""Authentication of a master-agent connection, on the raw socket before rpyc speaks.

It happens on every address (loopback included): optional mutual TLS with a
private CA (certificates carry their role as extended key usage, serverAuth for
agents and clientAuth for masters, and the master checks the agent's name
against the node's address), the agent's banner (whether it requires a secret),
then (when a secret is set) a mutual HMAC-SHA256 challenge. Every agent requires
the shared secret or TLS (it refuses to start with neither), and a master
refuses to connect without one of them. The agent proves the secret to the
master too, so a master never sends jobs to an impostor.

The handshake also derives the session's frame keys, one per direction, from the
secret and both nonces: :class:`jodl.agent.wire.FramedChannel` tags every rpyc
frame with them, so a peer that relayed the handshake without knowing the
secret can neither inject, alter, reorder nor replay a frame. With TLS alone,
TLS itself binds the session.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from rpyc.utils.authenticators import AuthenticationError  # type: ignore[import-untyped]

from ..config import Settings, check_secret
from ..exceptions import AuthError, ConfigError

#: Bumped on any incompatible change of the calls (see :mod:`jodl.agent`).
PROTOCOL_VERSION = 2
_MAGIC = b"JODL%d" % PROTOCOL_VERSION
_NONCE_BYTES = 32
#: Where the authenticator hands the session's frame keys to the server (never logged).
_KEYS = "_frame_keys"
#: Banner flags: the agent requires the shared secret, or it relies on TLS alone.
_SECRET, _TLS_ONLY = b"S", b"T"


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
                tls_sock = _tls_handshake(tls, sock, deadline, server_side=True)
                sock = tls_sock
                _check_role(tls_sock.getpeercert(binary_form=True), CLIENT_AUTH, "master")
                credentials["cert"] = tls_sock.getpeercert()
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
            tls_sock = _tls_handshake(_client_tls(settings), sock, deadline, server_hostname=host)
            sock = tls_sock
            der = tls_sock.getpeercert(binary_form=True)
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
        hint = (
            "JODL_SECRET and JODL_TLS_* (certificate role and name)"
            if settings.tls
            else "JODL_SECRET"
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
