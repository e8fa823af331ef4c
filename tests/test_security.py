"""Who may call an agent, and what a caller can reach: real agents, real sockets, real TLS.

A peer without the shared secret or a certificate of the private CA gets no call
through; an authenticated peer reaches the ``exposed_`` calls and nothing else
(no attribute walk into the agent's objects); arguments that are not plain value
types (rpyc netrefs of lists, dicts or any object) are refused without the agent
ever calling back into them.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import os
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import rpyc
import sqlalchemy as sa
from agents import (
    TEST_SECRET,
    AgentProcess,
    faulty_agent,
    free_port,
    run_jodl,
    start_agent,
    wait_for,
)
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from rpyc.core.stream import SocketStream

from jodl.agent.auth import _MAGIC as MAGIC
from jodl.agent.auth import client_handshake
from jodl.agent.client import AgentLink
from jodl.agent.registry import hello
from jodl.agent.replies import AgentFamily, BadReply, check_done
from jodl.agent.wire import STRICT_CONFIG, FramedChannel, connect
from jodl.exceptions import AgentUnavailable, AuthError
from jodl.log import Store, make_engine
from jodl.log.migrate import upgrade
from jodl.log.models import ExecState, Execution, NodeState
from jodl.master import Master
from jodl.settings.config import Settings

SECRET = "correct horse battery staple"  # long enough (22+ characters)
WRONG = "incorrect horse battery staple"

# -- a private CA in a temporary directory -------------------------------------------------


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


class CA:
    """A certificate authority that issues PEM files for agents and masters."""

    def __init__(self, directory: Path, name: str) -> None:
        self.directory = directory
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(_name(name))
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(
                x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )
        self.pem = directory / f"{name}.pem"
        self.pem.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self, name: str, role: str, names: tuple[str, ...] = ("localhost", "127.0.0.1")
    ) -> tuple[Path, Path]:
        """(certificate, key) files for ``name`` in ``role``: agent, master, both or none.

        ``names`` go into the subject alternative names (DNS names or IP addresses).
        """
        key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.UTC)
        sans: list[x509.GeneralName] = []
        for entry in names:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(entry)))
            except ValueError:
                sans.append(x509.DNSName(entry))
        usages = {
            "agent": [ExtendedKeyUsageOID.SERVER_AUTH],
            "master": [ExtendedKeyUsageOID.CLIENT_AUTH],
            "both": [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
            "none": [],
        }[role]
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        )
        if usages:
            builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        cert = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()),
            critical=False,
        ).sign(self.key, hashes.SHA256())
        cert_path = self.directory / f"{name}.crt"
        key_path = self.directory / f"{name}.key"
        cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, key_path)
        return cert_path, key_path


def tls_settings(ca: CA, cert: tuple[Path, Path], **kwargs: object) -> Settings:
    return Settings(
        tls_cert=str(cert[0]), tls_key=str(cert[1]), tls_ca=str(ca.pem), call_timeout=10.0
    ).replace(**kwargs)


def tls_env(ca: CA, cert: tuple[Path, Path]) -> dict[str, str | None]:
    """An agent's environment for TLS alone (no shared secret)."""
    return {
        "JODL_TLS_CERT": str(cert[0]),
        "JODL_TLS_KEY": str(cert[1]),
        "JODL_TLS_CA": str(ca.pem),
        "JODL_SECRET": None,
    }


# -- helpers ------------------------------------------------------------------------------------


def raw_rpyc_gets_nothing(agent: AgentProcess) -> None:
    """A plain rpyc client (no handshake) cannot make a single call."""
    try:
        conn = rpyc.connect(
            "127.0.0.1", agent.port, config={"sync_request_timeout": 10, "allow_pickle": False}
        )
    except (OSError, EOFError):
        return
    try:
        with pytest.raises((EOFError, OSError)):
            conn.root.ping()
    finally:
        conn.close()


def nothing_ran(agent: AgentProcess, settings: Settings) -> None:
    conn = connect(agent.address, settings)
    try:
        assert conn.root.remaining(conn.root.ping()[1]) == (0, 0, 0, 0)
    finally:
        conn.close()


class Spy:
    """Records every use the agent might make of it through a netref."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __int__(self) -> int:
        self.calls.append("int")
        return 1

    def __index__(self) -> int:
        self.calls.append("index")
        return 1

    def __str__(self) -> str:
        self.calls.append("str")
        return "noop"

    def __len__(self) -> int:
        self.calls.append("len")
        return 3

    def __iter__(self):  # type: ignore[no-untyped-def]
        self.calls.append("iter")
        return iter((1, "noop", "{}"))

    def __getitem__(self, index: int) -> object:
        self.calls.append("getitem")
        return (1, "noop", "{}")[index]


# -- shared secret --------------------------------------------------------------------------------


def test_only_a_peer_with_the_secret_gets_through(spawn_agent: Callable[..., AgentProcess]):
    agent = spawn_agent(env={"JODL_SECRET": SECRET})
    good = Settings(secret=SECRET, call_timeout=10.0)
    conn = connect(agent.address, good)
    assert conn.root.ping()[0]
    conn.close()

    with pytest.raises(AuthError, match="JODL_SECRET"):
        connect(agent.address, Settings(secret=WRONG, call_timeout=10.0))
    with pytest.raises(AuthError, match="without authentication"):
        connect(agent.address, Settings(call_timeout=10.0))
    raw_rpyc_gets_nothing(agent)
    # A peer that answers the banner with bytes that are not the protocol's is dropped
    # at once (exactly the magic's length is sent, so the close is a clean FIN).
    with socket.create_connection(("127.0.0.1", agent.port), timeout=10) as sock:
        sock.sendall(b"GET /"[: len(MAGIC)])
        received = b""
        while chunk := sock.recv(4096):
            received += chunk
    assert received.startswith(MAGIC + b"S"), "the banner says a secret is required"
    assert len(received) == len(MAGIC) + 1 + 8 + 32, "then the agent closed the connection"
    nothing_ran(agent, good)
    assert agent.alive()


def test_a_master_with_a_secret_refuses_an_agent_without_one(
    tmp_path: Path,
    spawn_agent: Callable[..., AgentProcess],
):
    ca = CA(tmp_path, "jodl-ca")
    agent = spawn_agent(env=tls_env(ca, ca.issue("agent", "agent")))
    with pytest.raises(AuthError, match="has no key"):
        connect(agent.address, tls_settings(ca, ca.issue("master", "master"), secret=SECRET))


def test_a_master_with_the_wrong_secret_marks_the_node_unreachable(store, spawn_agent, settings):
    agent = spawn_agent(env={"JODL_SECRET": SECRET})
    node = store.add_node(agent.address, slots=2)
    master = Master(settings.replace(secret=WRONG), store=store)
    try:
        master.start()
    finally:
        master.close()
    (row,) = [n for n in store.nodes() if n.id == node.id]
    assert row.state == NodeState.UNREACHABLE
    assert "authentication failed" in (row.last_error or "")


# -- mutual TLS ----------------------------------------------------------------------


def test_mutual_tls_admits_only_certificates_of_the_private_ca(
    tmp_path: Path, spawn_agent: Callable[..., AgentProcess]
):
    ca = CA(tmp_path, "jodl-ca")
    rogue = CA(tmp_path, "rogue-ca")
    agent = spawn_agent(env=tls_env(ca, ca.issue("agent", "agent")))
    master = tls_settings(ca, ca.issue("master", "master"))

    conn = connect(agent.address, master)
    assert conn.root.ping()[0]
    conn.close()

    # A client certificate signed by another CA (the client trusts the right CA).
    with pytest.raises(AuthError, match="TLS"):
        connect(agent.address, tls_settings(ca, rogue.issue("intruder", "master")))
    # No client certificate at all.
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(str(ca.pem))
    with socket.create_connection(("127.0.0.1", agent.port), timeout=10) as sock:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            with ctx.wrap_socket(sock) as tls:
                assert tls.recv(64) == b"", "no banner without a client certificate"
    raw_rpyc_gets_nothing(agent)
    nothing_ran(agent, master)


def test_a_master_refuses_an_agent_certified_by_another_ca(
    tmp_path: Path, spawn_agent: Callable[..., AgentProcess]
):
    ca = CA(tmp_path, "jodl-ca")
    rogue = CA(tmp_path, "rogue-ca")
    impostor = spawn_agent(env=tls_env(rogue, rogue.issue("impostor", "agent")))
    with pytest.raises(AuthError, match="TLS"):
        connect(impostor.address, tls_settings(ca, ca.issue("master", "master")))


def test_certificates_carry_their_role(tmp_path: Path, spawn_agent: Callable[..., AgentProcess]):
    """serverAuth makes an agent, clientAuth a master; a certificate without a role is neither."""
    ca = CA(tmp_path, "jodl-ca")
    agent = spawn_agent(env=tls_env(ca, ca.issue("agent", "agent")))
    master = tls_settings(ca, ca.issue("master", "master"))
    # An agent's certificate (say, taken from another agent) does not make a master.
    with pytest.raises(AuthError):
        connect(agent.address, tls_settings(ca, ca.issue("agent-2", "agent")))
    with pytest.raises(AuthError, match="JODL_TLS"):
        connect(agent.address, tls_settings(ca, ca.issue("no-role", "none")))
    nothing_ran(agent, master)
    # A master's certificate, or one without a role, does not make an agent.
    for role in ("master", "none"):
        impostor = spawn_agent(env=tls_env(ca, ca.issue(f"impostor-{role}", role)))
        with pytest.raises(AuthError, match="serverAuth|TLS"):
            connect(impostor.address, master)


def test_an_agent_registers_with_its_agent_certificate_and_for_its_own_name_only(
    tmp_path: Path, store: Store, settings: Settings
):
    """Self-registration over TLS needs no master's role: the master is the TLS client
    on its registration port too, and checks the agent's certificate names the address."""
    ca = CA(tmp_path, "jodl-ca")
    listen = f"127.0.0.1:{free_port()}"
    master_tls = tls_settings(
        ca, ca.issue("master", "master"), database_url=settings.database_url
    ).replace(register_listen=listen)
    master = Master(master_tls, store=store)
    master.start()
    try:
        hello(listen, "127.0.0.1:7001", 2, tls_settings(ca, ca.issue("agent", "agent")))
        elsewhere = ca.issue("elsewhere", "agent", names=("other.example",))
        with pytest.raises(AgentUnavailable, match="TLS"):
            hello(listen, "127.0.0.1:7002", 2, tls_settings(ca, elsewhere))
        with pytest.raises(AgentUnavailable, match="TLS"):  # a master's certificate is no agent's
            hello(listen, "127.0.0.1:7003", 2, tls_settings(ca, ca.issue("m2", "master")))
    finally:
        master.close()
    assert [n.address for n in store.nodes()] == ["127.0.0.1:7001"]


def test_the_master_checks_the_agents_name_against_the_node_address(
    tmp_path: Path, spawn_agent: Callable[..., AgentProcess]
):
    ca = CA(tmp_path, "jodl-ca")
    master = tls_settings(ca, ca.issue("master", "master"))
    names = ("node-7.example", "10.9.8.7")
    elsewhere = spawn_agent(env=tls_env(ca, ca.issue("node-7", "agent", names=names)))
    with pytest.raises(AuthError, match="mismatch|match"):
        connect(elsewhere.address, master)  # a valid agent certificate, for another node
    here = spawn_agent(env=tls_env(ca, ca.issue("node-1", "agent", names=("127.0.0.1",))))
    conn = connect(here.address, master)
    try:
        assert conn.root.ping()[0]
    finally:
        conn.close()


# -- what an authenticated peer can reach --------------------------------------------


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """The root object of one agent shared by this module's probes (none of them runs a job)."""
    agent = start_agent(tmp_path_factory.mktemp("probed-agent"))
    conn = connect(agent.address, Settings(call_timeout=10.0, secret=TEST_SECRET))
    yield conn.root
    conn.close()
    agent.kill()


@pytest.mark.parametrize(
    "path",
    [
        "_conn",
        "__dict__",
        "_core",
        "_protocol",
        "service",
        "exposed_send.__globals__",
        "exposed_send.__func__",
        "exposed_send.__self__",
        "exposed_init.__code__",
        "send.__self__",
        "ping.__self__",
        "send.__func__",
        "ping.__globals__",
        "exposed_ping.__closure__",
        "on_connect.__globals__",
    ],
)
def test_an_attribute_walk_over_the_agent_is_refused(root, path: str):
    obj = root
    with pytest.raises(AttributeError):
        for part in path.split("."):
            obj = getattr(obj, part)
    assert root.ping()[0], "the agent still serves"


def test_the_root_class_is_not_reachable(root):
    # rpyc answers __class__ locally (a class of this process, found by name, or a
    # placeholder) when the agent refuses it: never a proxy to the agent's class.
    cls = root.__class__
    assert not isinstance(cls, rpyc.BaseNetref)
    assert type(cls) is type


@pytest.mark.parametrize(
    "call",
    [
        lambda r: r.send(1, [(1, "noop", "{}")]),
        lambda r: r.send(1, ([1, "noop", "{}"],)),
        lambda r: r.send(1, ((1, "noop", ["{}"]),)),
        lambda r: r.send(1, ((1, "noop", {"a": 1}),)),
        lambda r: r.held(1, [1, 2]),
        lambda r: r.held(1, {1: 1}),
        lambda r: r.done(1, (1,), [10]),
        lambda r: r.ack(1, {1, 2}),
        lambda r: r.take_back(1, 1, [1]),
        lambda r: r.init(["master"], 1, "{}"),
    ],
)
def test_a_netref_where_a_value_is_expected_is_refused(root, call):
    with pytest.raises(TypeError, match="plain"):
        call(root)
    assert root.remaining(1) == (0, 0, 0, 0), "nothing was queued"


@pytest.mark.parametrize(
    "call",
    [
        lambda r, spy: r.send(1, (spy,)),
        lambda r, spy: r.send(spy, ()),
        lambda r, spy: r.send(1, ((spy, "noop", "{}"),)),
        lambda r, spy: r.send(1, ((1, spy, "{}"),)),
        lambda r, spy: r.send(1, ((1, "noop", spy),)),
        lambda r, spy: r.held(1, (spy,)),
        lambda r, spy: r.done(1, (), spy),
        lambda r, spy: r.init("m", spy, "{}"),
        lambda r, spy: r.init("m", 1, spy),
    ],
)
def test_the_agent_never_calls_back_into_a_netref(root, call):
    spy = Spy()
    with pytest.raises(TypeError):
        call(root, spy)
    assert spy.calls == [], "the agent used the caller's object"
    assert root.remaining(1) == (0, 0, 0, 0)


# -- no agent without authentication, loopback included ------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "[::]", "127.0.0.1", "localhost"])
def test_an_agent_without_auth_refuses_to_start_on_any_address(host: str):
    result = run_jodl(
        "agent", "--listen", f"{host}:{free_port()}", env={"JODL_SECRET": None}, timeout=60
    )
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "refusing to listen" in lines[0] and "JODL_SECRET" in lines[0]
    assert "Traceback" not in result.stderr


def test_an_agent_with_a_short_secret_refuses_to_start():
    result = run_jodl("agent", "--listen", f"127.0.0.1:{free_port()}",
                      env={"JODL_SECRET": "hunter2"}, timeout=60)  # fmt: skip
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "JODL_SECRET is too short" in lines[0], result.stderr


def test_a_master_without_auth_refuses_to_connect(spawn_agent):
    agent = spawn_agent()
    with pytest.raises(AuthError, match="refusing to connect.*JODL_SECRET"):
        connect(agent.address, Settings(call_timeout=10.0))
    with pytest.raises(AuthError, match="JODL_SECRET is too short"):
        connect(agent.address, Settings(call_timeout=10.0, secret="hunter2"))


def test_a_local_user_without_the_secret_cannot_command_a_loopback_agent(spawn_agent, settings):
    """The attack on an open loopback agent: forge a job, read results, fence the master."""
    agent = spawn_agent()  # the fixtures' agents carry the test secret, like `jodl up`'s
    raw_rpyc_gets_nothing(agent)
    with pytest.raises(AuthError):
        connect(agent.address, settings.replace(secret="a-guess-of-the-local-user-0000"))
    # Nothing of the attempts reached the agent: epoch 0, nothing queued.
    conn = connect(agent.address, settings)
    try:
        assert conn.root.ping()[1] == 0, "no init with a huge epoch got through"
        assert conn.root.remaining(0) == (0, 0, 0, 0)
    finally:
        conn.close()


def test_an_agent_on_loopback_answers_health_pings(spawn_agent):
    agent = spawn_agent()
    wait_for(agent.alive, what="agent alive")
    conn = connect(agent.address, Settings(call_timeout=10.0, secret=TEST_SECRET))
    try:
        assert conn.root.ping()[1] == 0
    finally:
        conn.close()


# -- slow handshakes -------------------------------------------------------------------------------


def threads_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the peer closed ``sock`` (whatever it sent before is read and dropped)."""
    try:
        while True:
            data = sock.recv(4096, socket.MSG_DONTWAIT)
            if not data:
                return True
    except BlockingIOError:
        return False
    except OSError:
        return True


def test_slow_handshakes_neither_pile_up_threads_nor_last(spawn_agent):
    """40 peers drip the handshake a byte at a time: a bounded number of threads, each briefly."""
    settings = Settings(call_timeout=10.0, secret=TEST_SECRET)
    agent = spawn_agent(env={"JODL_HANDSHAKE_LIMIT": "8", "JODL_HANDSHAKE_TIMEOUT": "3"})
    conn = connect(agent.address, settings)
    assert conn.root.ping()[0]
    conn.close()
    wait_for(lambda: threads_of(agent.pid) <= 12, what="the agent to settle")
    idle_threads = threads_of(agent.pid)
    # Each peer sends what a master would, one byte every 0.2 s: a timeout per recv
    # alone never fires, only a deadline for the whole handshake does.
    drip = (MAGIC + b"\0" * 64) * 4
    peers = [socket.create_connection(("127.0.0.1", agent.port), timeout=10) for _ in range(40)]
    try:
        closed: set[int] = set()
        peak = 0
        position = 0

        def all_closed() -> bool:
            nonlocal peak, position
            peak = max(peak, threads_of(agent.pid))
            for i, peer in enumerate(peers):
                if i not in closed and closed_by_peer(peer):
                    closed.add(i)
            for i, peer in enumerate(peers):
                if i not in closed:
                    with contextlib.suppress(OSError):
                        peer.send(drip[position : position + 1])
            position += 1
            time.sleep(0.2)
            return len(closed) == len(peers)

        wait_for(all_closed, timeout=60, what="the agent to close every slow handshake")
        # At most the limit in the handshake (one thread each) beyond the idle agent's
        # threads; the rest were closed at accept, without a thread.
        assert peak <= idle_threads + 8 + 1, (peak, idle_threads)
    finally:
        for peer in peers:
            peer.close()
    conn = connect(agent.address, settings)  # the agent still serves masters
    assert conn.root.ping()[0]
    conn.close()
    # Connections reset at once (before the agent even asks who they are) give their
    # handshake slot back too: the agent still serves masters afterwards.
    for _ in range(30):
        peer = socket.create_connection(("127.0.0.1", agent.port), timeout=10)
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()  # RST

    def serves() -> bool:
        try:
            conn = connect(agent.address, settings)
        except AuthError:
            return False  # turned away while the resets still held their slots
        try:
            return bool(conn.root.ping()[0])
        finally:
            conn.close()

    wait_for(serves, timeout=20, what="the agent to serve a master after the resets")


# -- a handshake relayed by a man in the middle -------------------------------------------------


class Relay:
    """A man in the middle without the secret: it forwards bytes both ways between a
    master and the real agent (so both complete their handshake), then stops
    forwarding and keeps the agent's side of the authenticated connection for itself."""

    def __init__(self, agent_port: int) -> None:
        self.agent_port = agent_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.forwarding = True
        self.done = threading.Event()
        self.agent_side: socket.socket | None = None
        self.master_side: socket.socket | None = None
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        try:
            self.master_side, _ = self.listener.accept()
            self.agent_side = socket.create_connection(("127.0.0.1", self.agent_port))
            pair = {self.master_side: self.agent_side, self.agent_side: self.master_side}
            while self.forwarding:
                readable, _, _ = select.select(list(pair), [], [], 0.05)
                for sock in readable:
                    data = sock.recv(65536)
                    if not data:
                        return
                    pair[sock].sendall(data)
        finally:
            self.done.set()

    def hijack(self) -> socket.socket:
        """Stop forwarding; the agent's side of the connection, now the relay's own."""
        self.forwarding = False
        assert self.done.wait(10), "the relay stopped"
        assert self.agent_side is not None
        return self.agent_side

    def close(self) -> None:
        for sock in (self.listener, self.master_side, self.agent_side):
            if sock is not None:
                sock.close()


def test_a_relayed_handshake_gives_the_relay_no_session(spawn_agent):
    """The relay attack: a node without the secret passes the agent's nonce to a
    master and the master's proof back; it must not get a session it can use."""
    agent = spawn_agent()
    settings = Settings(call_timeout=10.0, secret=TEST_SECRET)
    relay = Relay(agent.port)
    try:
        master = connect(f"127.0.0.1:{relay.port}", settings)  # authenticates through the relay
        stolen = relay.hijack()
        config = dict(STRICT_CONFIG, sync_request_timeout=3)
        hijacked = rpyc.connect_stream(SocketStream(stolen), rpyc.VoidService, config=config)
        # The relay's own call (the lock-out of finding 1: init with a huge epoch) is
        # refused: the agent drops the connection at the first unauthenticated frame.
        with pytest.raises((EOFError, OSError, TimeoutError)):
            hijacked.root.init("relay", 2**62, "{}")
        master.close()
    finally:
        relay.close()
    conn = connect(agent.address, settings)
    try:
        assert conn.root.ping()[1] == 0, "the relay's init never ran"
    finally:
        conn.close()


class BitFlipper(SocketStream):
    """A socket stream that flips one bit of every frame's body once told to."""

    flip = False

    def write(self, data: bytes) -> None:
        if self.flip:
            data = data[:-40] + bytes([data[-40] ^ 1]) + data[-39:]
        super().write(data)


def test_a_tampered_frame_closes_the_session(spawn_agent):
    """One bit flipped in a frame of an authenticated session: the agent closes it."""
    agent = spawn_agent()
    settings = Settings(call_timeout=5.0, secret=TEST_SECRET)
    sock = socket.create_connection(("127.0.0.1", agent.port), timeout=10)
    sock, keys = client_handshake(sock, settings, agent.address)
    assert keys is not None
    stream = BitFlipper(sock)
    config = dict(STRICT_CONFIG, sync_request_timeout=5)
    conn = rpyc.connect_channel(FramedChannel(stream, *keys), rpyc.VoidService, config=config)
    try:
        assert conn.root.ping()[0], "untampered frames pass"
        stream.flip = True
        with pytest.raises((EOFError, OSError, TimeoutError)):
            conn.root.init("tampered", 2**62, "{}")
    finally:
        conn.close()
    conn = connect(agent.address, settings)
    try:
        assert conn.root.ping()[1] == 0, "the tampered init never ran"
    finally:
        conn.close()


# -- replies of a faulty agent ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "fault",
    [
        "outcomes-netref",
        "outcomes-malformed",
        "outcomes-not-json",
        "outcomes-nan",
        "init-slots-as-text",
        "send-netref",
        "cancel-shape",
        "outcomes-failed-shape",
        "exchange-netref",
        "exchange-refused-netref",
        "exchange-not-json",
        "exchange-failed-shape",
    ],
)
def test_a_faulty_agents_bad_replies_are_refused_and_the_cycle_completes(
    fault: str, sqlite_database: str, spawn_agent
):
    """Every reply is checked: a bad one marks that node faulty, the master carries on."""
    engine = make_engine(sqlite_database)
    upgrade(engine)
    store = Store(engine)
    good = spawn_agent()
    bad = spawn_agent(command=faulty_agent(fault))
    store.add_node(bad.address, slots=4)
    store.add_node(good.address, slots=4)
    family = store.ensure_family("noop")
    store.add_jobs(family, ((f"job-{i}", "{}") for i in range(200)))
    settings = Settings(database_url=sqlite_database, call_timeout=5.0, secret=TEST_SECRET)
    master = Master(settings, store=store)
    try:
        summary = master.run_cycle("noop")
    finally:
        master.close()
    assert (summary.total, summary.done, summary.dead) == (200, 200, 0)
    (row,) = [n for n in store.nodes() if n.address == bad.address]
    call = fault.split("-")[0]
    assert f"bad reply to {call}" in (row.last_error or ""), row.last_error
    with store.session() as s:
        results = s.scalars(
            sa.select(Execution.result).where(Execution.state == ExecState.DONE)
        ).all()
    assert len(results) == 200 and all(r == "null" for r in results), "no bad result logged"
    engine.dispose()


def test_every_result_of_a_done_batch_is_checked_as_json_on_its_own():
    """Results are checked one by one, not as a whole: two halves of a JSON value (which
    joined with a comma would read as one) are refused, naming the first bad execution;
    a value with blanks around it is JSON."""
    batch = "\n".join(("1,2,3", "0.1,0.1,0.1", "1.0,1.0,1.0", ' {"a": 1} ', "[1", "2],3"))
    with pytest.raises(BadReply, match="result of execution 2 is not JSON"):
        check_done(batch)
    rows = check_done("\n".join(("1,2", "0.1,0.1", "1.0,1.0", ' {"a": 1} ', "null")))
    assert [(r[0], r[3]) for r in rows] == [(1, ' {"a": 1} '), (2, "null")]


#: A call of the typed client per call of the protocol but init (a faulty agent answers
#: each with a reply of the wrong shape: see ``tests/faulty_agent.py``).
TYPED_CALLS: dict[str, Callable[[AgentLink], object]] = {
    "send": lambda link: link.send(1, ((1, "noop", "{}"),)),
    "done": lambda link: link.done(1, (), 10),
    "failed": lambda link: link.failed(1, (), 10),
    "outcomes": lambda link: link.outcomes(1, (), 10),
    "exchange": lambda link: link.exchange(1, ((1, "noop", "{}"),), (), 10),
    "remaining": lambda link: link.remaining(1),
    "take_back": lambda link: link.take_back(1, 1),
    "ack": lambda link: link.ack(1, (7,)),
    "cancel": lambda link: link.cancel(1, (7,)),
    "held": lambda link: link.held(1, (7,)),
    "ping": lambda link: link.ping(),
    "families": lambda link: link.families(),
}


def test_a_reply_of_the_wrong_shape_is_refused_for_every_call(spawn_agent):
    """Every call's reply is checked before use: a wrong shape counts the agent faulty."""
    settings = Settings(call_timeout=5.0, secret=TEST_SECRET)
    bad = spawn_agent(command=faulty_agent(",".join(f"{c}-shape" for c in TYPED_CALLS)))
    link = AgentLink(1, bad.address, settings)
    for name, call in TYPED_CALLS.items():
        link.open("typed-master", 1)
        assert link.connected and link.failures == 0
        with pytest.raises(AgentUnavailable, match=f"bad reply to {name} "):
            call(link)
        assert not link.connected and link.failures == 1, name
        assert link.last_error is not None and "the agent is faulty" in link.last_error
    bad_init = spawn_agent(command=faulty_agent("init-shape"))
    link = AgentLink(2, bad_init.address, settings)
    with pytest.raises(AgentUnavailable, match="bad reply to init"):
        link.open("typed-master", 1)
    assert not link.connected and link.failures == 1


def test_the_typed_client_returns_named_records(spawn_agent):
    """Replies come back as records that still unpack as the tuples they were."""
    settings = Settings(call_timeout=5.0, secret=TEST_SECRET)
    agent = spawn_agent()
    link = AgentLink(1, agent.address, settings)
    info = link.open("typed-master", 3)
    assert info.epoch == 3 and info.session == link.session and info.slots >= 1
    assert info.families["noop"] == AgentFamily("noop", "1", False, True)
    assert link.ping().epoch == 3
    assert {f.name for f in link.families()} >= {"noop", "fail", "mark"}
    refused = link.send(
        3, ((1, "noop", "{}"), (2, "fail", '{"permanent": true}'), (3, "no-such", "{}"))
    )
    assert [(r.exec_id, "unknown family" in r.reason) for r in refused] == [(3, True)]
    wait_for(lambda: link.remaining(3).held_done + link.remaining(3).held_failed == 2)
    (done,) = link.done(3, (), 10)
    exec_id, duration, finished, result = done
    assert (exec_id, result) == (done.exec_id, done.result) == (1, "null") and duration >= 0
    (failed,) = link.failed(3, (), 10)
    assert failed.exec_id == 2 and failed.retryable is False and "on purpose" in failed.error
    assert link.ack(3, (1, 2)) == 2
    assert link.held(3, (1, 2)) == () and link.remaining(3) == (0, 0, 0, 0)
    link.close()
