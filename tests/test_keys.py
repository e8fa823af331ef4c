"""Node keys: an agent's key serves its master and says hello for its own node, and
commands no other agent; the secret is rotated while masters and agents run.

Real ``jodl agent`` subprocesses on loopback, a real master, real sockets.
"""

from __future__ import annotations

import os
import secrets
import socket
from collections.abc import Callable

import pytest
from agents import AgentProcess, free_port, wait_for

from jodl import Master, Settings, Store
from jodl.agent.auth import _MAGIC as MAGIC
from jodl.agent.keys import KEY_ID_BYTES, key_id, mac, node_key
from jodl.agent.registry import hello
from jodl.agent.wire import connect, hello_connect
from jodl.exceptions import AgentUnavailable, AuthError

SECRET = secrets.token_urlsafe(32)
NEW_SECRET = secrets.token_urlsafe(32)


def keyed(address: str, secret: str = SECRET) -> dict[str, str | None]:
    """An agent's environment with its own node key and no cluster secret."""
    return {"JODL_SECRET": None, "JODL_NODE_KEY": node_key(secret, address)}


def spawn_keyed(
    spawn_agent: Callable[..., AgentProcess], secret: str = SECRET, port: int | None = None
) -> AgentProcess:
    port = port or free_port()
    return spawn_agent(env=keyed(f"127.0.0.1:{port}", secret), port=port)


def test_one_agents_key_cannot_command_another_agent(spawn_agent) -> None:
    a, b = spawn_keyed(spawn_agent), spawn_keyed(spawn_agent)
    master = Settings(secret=SECRET, call_timeout=10.0)
    for agent in (a, b):  # the master derives each node's key from its secret
        conn = connect(agent.address, master)
        assert conn.root.ping()[0]
        conn.close()
    stolen = node_key(SECRET, a.address)  # everything agent A's host holds
    # A's key used as if it were the cluster secret: B's key is not derived from it.
    with pytest.raises(AuthError, match="authentication failed"):
        connect(b.address, Settings(secret=stolen, call_timeout=10.0))
    # Nor does a proof under A's key pass, whatever key id the peer claims.
    with socket.create_connection(("127.0.0.1", b.port), timeout=10) as sock:
        banner = b""
        while len(banner) < len(MAGIC) + 1 + KEY_ID_BYTES + 32:
            banner += sock.recv(4096)
        assert banner[len(MAGIC) + 1 : len(MAGIC) + 1 + KEY_ID_BYTES] != key_id(stolen)
        nonce, mine = banner[-32:], os.urandom(32)
        sock.sendall(MAGIC + mac(stolen, MAGIC + b"master", nonce, mine) + mine)
        assert sock.recv(4096) == b"", "B closes the connection without a proof of its own"
    conn = connect(b.address, master)
    try:
        assert conn.root.ping()[1] == 0, "B never heard an init"
    finally:
        conn.close()


def test_a_node_key_says_hello_for_its_own_node_only(store: Store, settings: Settings) -> None:
    listen = f"127.0.0.1:{free_port()}"
    master = Master(settings.replace(register_listen=listen, secret=SECRET), store=store)
    master.start()
    mine = Settings(node_key=node_key(SECRET, "127.0.0.1:7001"), call_timeout=10.0)
    try:
        hello(listen, "127.0.0.1:7001", 2, mine)
        with pytest.raises(AgentUnavailable, match="hello"):
            hello(listen, "127.0.0.1:7002", 2, mine)  # the handshake names the address
        conn = hello_connect(listen, "127.0.0.1:7001", mine)
        try:  # authenticated as 7001, the call itself names another node
            with pytest.raises(Exception, match="proved it is 127.0.0.1:7001"):
                conn.root.hello("127.0.0.1:7002", 1, "{}")
        finally:
            conn.close()
    finally:
        master.close()
    assert [n.address for n in store.nodes()] == ["127.0.0.1:7001"]


def test_the_secret_is_rotated_while_the_cluster_runs(
    store: Store, settings: Settings, spawn_agent: Callable[..., AgentProcess]
) -> None:
    """Masters accept the old and the new secret; each agent moves to its new key on its
    own (a restart on the same address); then the old secret is dropped."""
    port = free_port()
    address = f"127.0.0.1:{port}"
    listen = f"127.0.0.1:{free_port()}"
    agent = spawn_agent(env=keyed(address, SECRET), port=port, args=("--register", listen))
    family = store.ensure_family("noop")
    rotating = settings.replace(secret=NEW_SECRET, secret_previous=SECRET, register_listen=listen)
    master = Master(rotating, store=store)
    master.start()
    try:
        wait_for(lambda: store.nodes(), what="the agent's hello under its old key")
        store.add_jobs(family, ((f"a{i}", "{}") for i in range(20)))
        assert master.run_cycle("noop").done == 20
        agent.stop()  # its new key, on the same address
        agent = spawn_agent(env=keyed(address, NEW_SECRET), port=port, args=("--register", listen))
        store.add_jobs(family, ((f"b{i}", "{}") for i in range(20)))
        summary = master.run_cycle("noop")
        assert summary.done == summary.total > 0 and not summary.dead
    finally:
        master.close()
    assert connect(address, Settings(secret=NEW_SECRET, call_timeout=10.0)).root.ping()[0]
    # The old secret dropped: an agent still on its old key is refused, saying what to do.
    agent.stop()
    spawn_agent(env=keyed(address, SECRET), port=port)
    with pytest.raises(AuthError, match=f"jodl node key {address}"):
        connect(address, Settings(secret=NEW_SECRET, call_timeout=10.0))
    assert connect(address, Settings(secret=SECRET, call_timeout=10.0)).root.ping()[0]


def test_an_agent_refuses_a_key_that_is_not_a_node_key(spawn_agent) -> None:
    with pytest.raises(RuntimeError, match="JODL_NODE_KEY is not a node key"):
        spawn_agent(env={"JODL_SECRET": None, "JODL_NODE_KEY": "x" * 40})
