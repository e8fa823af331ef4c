"""The rpyc transport: strict configuration, authenticated frames, the guarded server, connect.

Every rpyc frame after the handshake (:mod:`jodl.agent.auth`) carries an
HMAC-SHA256 of (direction key; frame number, header, body)
(:class:`FramedChannel`): the receiver closes the connection at the first bad
tag. The agent's server (:class:`GuardedServer`) authenticates every connection
and caps unfinished handshakes; :func:`connect` is the master's side.
"""

from __future__ import annotations

import hashlib
import hmac
import socket
import struct
import zlib
from collections.abc import Callable
from typing import Any

import rpyc  # type: ignore[import-untyped]
from rpyc.core.channel import Channel  # type: ignore[import-untyped]
from rpyc.core.stream import SocketStream  # type: ignore[import-untyped]
from rpyc.lib import spawn  # type: ignore[import-untyped]
from rpyc.utils.server import ThreadedServer  # type: ignore[import-untyped]

from ..settings.config import Settings
from .admission import HandshakeSlots
from .auth import (
    _KEYS,
    SessionKeys,
    client_handshake,
    hello_handshake,
    require_auth,
    server_authenticator,
)
from .keys import FIRST_KEYS, KeyRange

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


class GuardedServer(ThreadedServer):
    """rpyc's ThreadedServer with authentication on and a cap on unfinished handshakes.

    Connections in the handshake are admitted by :class:`~jodl.agent.admission.HandshakeSlots`
    (``JODL_HANDSHAKE_LIMIT`` in all, a share per address, room kept for addresses
    that authenticated before; each has ``JODL_HANDSHAKE_TIMEOUT`` for all of it); a
    connection turned away is closed as soon as it is accepted, without a thread:
    slow or silent peers can neither pile up threads nor keep a master out.
    """

    def __init__(
        self,
        service: Any,
        settings: Settings,
        authenticate: Callable[[socket.socket], tuple[Any, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        authenticate = authenticate or server_authenticator(settings)
        super().__init__(service, authenticator=authenticate, **kwargs)
        self.admission = HandshakeSlots(settings.handshake_limit)
        #: Sockets in the handshake -> their peer's address (dict.pop is atomic: one
        #: release each).
        self._holding: dict[socket.socket, str] = {}
        self._turned_away = 0

        def bounded(sock: socket.socket) -> tuple[Any, Any]:
            try:
                result = authenticate(sock)
                address = self._holding.get(sock)
                if address is not None:
                    self.admission.authenticated(address)
                return result
            finally:
                self._end_handshake(sock)

        self.authenticator = bounded

    def _end_handshake(self, sock: socket.socket) -> None:
        address = self._holding.pop(sock, None)
        if address is not None:  # else released already
            self.admission.give_back(address)

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
            service = self.service_for(credentials or {})
            conn = service._connect(open_channel(sock, keys), config)
            self._handle_connection(conn)
        finally:
            self.logger.info("goodbye %s", addrinfo)

    def service_for(self, credentials: dict[str, Any]) -> Any:
        """The service of an authenticated connection (the same for all by default)."""
        return self.service

    def _accept_method(self, sock: socket.socket) -> None:
        try:
            address = str(sock.getpeername()[0])
        except OSError:
            address = None  # reset already
        if address is None or not self.admission.take(address):
            self._turned_away += 1
            if self._turned_away in (1, 10, 100) or self._turned_away % 1000 == 0:
                self.logger.warning(
                    "%d connection(s) closed at once: the handshake slots are taken "
                    "(JODL_HANDSHAKE_LIMIT %d, at most %d per address)",
                    self._turned_away,
                    self.admission.limit,
                    self.admission.per_address,
                )
            self.clients.discard(sock)
            try:
                sock.close()
            except OSError:
                pass
            return
        self._holding[sock] = address
        try:
            spawn(self._serve, sock)
        except BaseException:
            self._end_handshake(sock)
            raise


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


def connect(
    address: str,
    settings: Settings,
    timeout: float | None = None,
    generations: KeyRange = FIRST_KEYS,
) -> rpyc.Connection:
    """Open an authenticated rpyc connection to the agent at ``address`` (HOST:PORT),
    whose node key is of one of ``generations`` (the log's, for a rekeyed node)."""
    require_auth(settings, f"refusing to connect to {address}")
    return _dial(
        address,
        settings,
        timeout,
        lambda sock: client_handshake(sock, settings, address, generations),
    )


def hello_connect(master: str, address: str, settings: Settings) -> rpyc.Connection:
    """Open an authenticated rpyc connection to the registration port of the master at
    ``master``, as the agent at ``address`` (which its key or certificate must name)."""
    return _dial(
        master, settings, None, lambda sock: hello_handshake(sock, settings, address, master)
    )


def _dial(
    address: str,
    settings: Settings,
    timeout: float | None,
    handshake: Callable[[socket.socket], tuple[socket.socket, SessionKeys | None]],
) -> rpyc.Connection:
    host, port = split_address(address)
    sock = socket.create_connection((host, port), timeout=timeout or settings.call_timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    try:
        sock, keys = handshake(sock)
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
