"""Real processes for tests: agents (``jodl agent``) and one-shot ``jodl`` commands.

Every agent is a subprocess listening on a free loopback port; :func:`start_agent`
returns once the port answers. The environment of every child is the test's own
minus any ``JODL_*`` variable (so a developer's shell cannot leak settings into a
test), plus :data:`TEST_SECRET` as ``JODL_SECRET`` (agents refuse to start without
authentication), plus the overrides given.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: Seconds an agent has to open its port.
START_TIMEOUT = 20.0
#: Seconds a one-shot command may take.
COMMAND_TIMEOUT = 120.0
#: The shared secret of this test session's agents and masters (fresh for every session).
TEST_SECRET = secrets.token_urlsafe(32)


def jodl_command() -> list[str]:
    """argv prefix that runs the installed ``jodl`` console script of this interpreter."""
    script = Path(sys.executable).with_name("jodl")
    if script.exists():
        return [str(script)]
    found = shutil.which("jodl")
    return [found] if found else [sys.executable, "-m", "jodl"]


def child_env(overrides: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """The environment for a child: no inherited ``JODL_*``, the test secret, every user
    admitted to the fetch allowlist, then ``overrides``.

    An override of None unsets the variable (``{"JODL_SECRET": None}``: no secret).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("JODL_")}
    env.setdefault("JODL_LOG_LEVEL", "WARNING")
    env["JODL_SECRET"] = TEST_SECRET
    # Every user's jobs may use the agents' allowlist: the tests' sites are on loopback
    # (tests/conftest.py says the same for this process).
    env["JODL_FETCH_ALLOW_USERS"] = "*"
    env["PYTHONUNBUFFERED"] = "1"
    for key, value in (overrides or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


#: Ports :func:`free_port` handed out in this process.
_GIVEN: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, and that this process
    never handed out before: agents started together (``wait=False``) bind theirs only
    later, and the kernel may offer a free port twice meanwhile. Two agents were then
    given one address, and a test that started two saw one node."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def port_answers(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_for(
    condition: Callable[[], object], timeout: float = 30.0, what: str = "condition"
) -> object:
    """Poll ``condition`` until it returns something true; AssertionError after ``timeout``."""
    deadline = time.monotonic() + timeout
    pause = 0.005
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(pause)
        pause = min(0.1, pause * 2)


@dataclass
class AgentProcess:
    """One running ``jodl agent`` subprocess."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    env: dict[str, str] = field(repr=False, default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def kill(self) -> None:
        """SIGKILL: the agent dies with whatever it held (a crash, not a shutdown)."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not exit within a few seconds."""
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()


def start_agent(
    log_dir: Path,
    env: Mapping[str, str | None] | None = None,
    port: int | None = None,
    args: tuple[str, ...] = (),
    wait: bool = True,
    command: Callable[[str], list[str]] | None = None,
) -> AgentProcess:
    """Start ``jodl agent --listen 127.0.0.1:PORT`` and wait until the port answers.

    ``env`` adds settings such as ``JODL_SECRET``, ``JODL_AGENT_SLOTS`` or
    ``JODL_AGENT_SPEED``. A port taken meanwhile by another process is retried
    with a new one (unless ``port`` was given). ``command`` builds another argv
    from the address (e.g. :func:`faulty_agent`).
    """
    for _ in range(5):
        chosen = port or free_port()
        log_path = Path(log_dir) / f"agent-{chosen}.log"
        full_env = child_env(env)
        address = f"127.0.0.1:{chosen}"
        argv = command(address) if command else [*jodl_command(), "agent", "--listen", address]
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                [*argv, *args],
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        agent = AgentProcess(proc, chosen, log_path, full_env)
        if not wait:
            return agent
        deadline = time.monotonic() + START_TIMEOUT
        while agent.alive() and time.monotonic() < deadline:
            if port_answers(chosen):
                return agent
            time.sleep(0.02)
        agent.kill()
        if port is None and "cannot listen" in agent.log():
            continue  # lost a race for the port: try another one
        raise RuntimeError(f"agent on port {chosen} did not start:\n{agent.log()}")
    raise RuntimeError("no free port found for an agent")


def faulty_agent(fault: str) -> Callable[[str], list[str]]:
    """``command`` for :func:`start_agent`: a real agent whose ``fault`` answers wrong.

    See ``tests/faulty_agent.py`` for the faults (e.g. ``done-netref``).
    """
    script = Path(__file__).with_name("faulty_agent.py")
    return lambda address: [sys.executable, str(script), address, fault]


def start_agents(
    log_dir: Path, count: int, env: Mapping[str, str | None] | None = None
) -> list[AgentProcess]:
    """Start ``count`` agents at once (their imports overlap) and wait until all answer."""
    started = [start_agent(log_dir, env=env, wait=False) for _ in range(count)]
    try:
        for i, agent in enumerate(started):
            deadline = time.monotonic() + START_TIMEOUT
            while not port_answers(agent.port):
                if not agent.alive() or time.monotonic() > deadline:
                    agent.kill()
                    if "cannot listen" not in agent.log():
                        raise RuntimeError(f"agent {agent.address} did not start:\n{agent.log()}")
                    started[i] = agent = start_agent(log_dir, env=env)  # lost a port race
                    break
                time.sleep(0.02)
    except BaseException:
        for agent in started:
            agent.kill()
        raise
    return started


def run_jodl(
    *args: str,
    env: Mapping[str, str | None] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    timeout: float = COMMAND_TIMEOUT,
) -> subprocess.CompletedProcess[str]:
    """Run ``jodl ARGS`` to completion; return its exit code, stdout and stderr (text)."""
    return subprocess.run(
        [*jodl_command(), *args],
        env=child_env(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def spawn_jodl(
    *args: str,
    log_path: Path,
    env: Mapping[str, str | None] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``jodl ARGS`` in the background with output to ``log_path`` (e.g. a master)."""
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [*jodl_command(), *args],
            env=child_env(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
