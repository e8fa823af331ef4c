"""Operators' commands: ``jodl profile`` and the live view of ``jodl status --watch``.

``status --watch`` reads the database (runs, nodes, queue; a running run's counts
are written by its master about once a second) and, when the master's ops
endpoint answers (``JODL_METRICS_LISTEN``), its per-node slots busy and round
trips from ``/metrics``.

Both first ask the endpoint to prove it holds this cluster's ops token
(:func:`check_peer`): any local user may bind a port first, and a process that
cannot prove it is ours gets nothing, neither a token nor our trust in its numbers.
"""

from __future__ import annotations

import datetime as dt
import hmac
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import click

from ..exceptions import JodlError
from ..settings.config import Settings

#: Seconds ``jodl profile`` waits beyond the profile's own length.
PROFILE_SLACK = 30.0


# -- jodl profile ------------------------------------------------------------------------------


def check_peer(address: str, role: str, token: str | None) -> None:
    """:class:`JodlError` unless the ops endpoint at ``address`` is a ``role`` process
    that proves it holds ``token`` (an HMAC of a fresh nonce; the token is not sent)."""
    import httpx

    from ..ops.server import ops_proof

    nonce = secrets.token_hex(16)
    try:
        body = httpx.get(f"{_base(address)}/ops/proof", params={"nonce": nonce}, timeout=5.0).json()
    except (httpx.HTTPError, ValueError) as exc:
        raise JodlError(f"cannot reach the ops endpoint at {address}: {exc}") from None
    found = body.get("role") if isinstance(body, dict) else None
    if found != role:
        raise JodlError(
            f"{address} is the endpoint of a {found or 'unknown'} process, not a {role}"
        )
    if token is None:
        return  # nothing to prove, and nothing will be sent
    proof = body.get("proof")
    if type(proof) is not str or not hmac.compare_digest(proof, ops_proof(token, role, nonce)):
        raise JodlError(
            f"{address} did not prove it is this cluster's {role} (another process may hold "
            "the port, or its JODL_OPS_TOKEN differs): nothing was sent to it"
        )


def _base(address: str) -> str:
    return address if "://" in address else f"http://{address}"


def fetch_profile(role: str, address: str, seconds: float, token: str | None) -> bytes:
    """Ask the ops endpoint at ``address`` for a ``seconds`` long profile; the pstats bytes.

    ``token``: the ops token (:func:`jodl.agent.keys.ops_token`), sent only once the
    endpoint proved it holds it too."""
    import httpx

    check_peer(address, role, token)
    base = _base(address)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        answer = httpx.get(
            f"{base}/debug/profile",
            params={"seconds": f"{seconds:g}"},
            headers=headers,
            timeout=seconds + PROFILE_SLACK,
        )
    except (httpx.HTTPError, ValueError) as exc:
        raise JodlError(f"cannot reach the ops endpoint at {address}: {exc}") from None
    if answer.status_code != 200:
        try:
            reason = answer.json().get("error", answer.text)
        except ValueError:
            reason = answer.text
        raise JodlError(f"{address} refused the profile ({answer.status_code}): {reason}")
    return answer.content


def register(main: click.Group) -> None:
    """Add the operators' commands to the ``jodl`` group."""

    @main.command("profile")
    @click.argument("role", type=click.Choice(["master", "agent"]))
    @click.argument("address")
    @click.option("--seconds", type=click.FloatRange(0.1, 300), default=10.0, show_default=True)
    @click.option("-o", "--output", default=None, help="File to write (default ROLE-TIME.pstats).")
    def profile(role: str, address: str, seconds: float, output: str | None) -> None:
        """Profile a live master or agent for N seconds (every thread) into a pstats file.

        ADDRESS is the process's ops endpoint (JODL_METRICS_LISTEN of a master,
        JODL_AGENT_METRICS_LISTEN of an agent), which profiles with JODL_PROFILING on.
        The endpoint first proves it holds the ops token (JODL_OPS_TOKEN, or derived
        from JODL_SECRET or JODL_NODE_KEY as in the process), then the token is sent;
        the secret itself never is. Open the file with `python -m pstats FILE`.
        """
        from ..agent.keys import ops_token

        data = fetch_profile(role, address, seconds, ops_token(Settings.from_env()))
        path = output or f"{role}-{time.strftime('%Y%m%d-%H%M%S')}.pstats"
        with open(path, "wb") as fh:
            fh.write(data)
        click.echo(f"profile of {seconds:g}s written to {path} (open: python -m pstats {path})")


# -- jodl status --watch ------------------------------------------------------------------------


@dataclass
class Snapshot:
    """What one refresh of the live view shows."""

    at: dt.datetime
    data: dict[str, Any]
    #: node address -> (slots busy, round trip seconds), from the master's /metrics.
    live: dict[str, tuple[float, float]] = field(default_factory=dict)


def _live_nodes(listen: str | None, token: str | None) -> dict[str, tuple[float, float]]:
    """Per-node figures from the master's /metrics; none unless it proves it is ours."""
    if not listen:
        return {}
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        check_peer(listen, "master", token)
        text = httpx.get(f"http://{listen}/metrics", timeout=1.0).text
    except (httpx.HTTPError, JodlError):
        return {}
    busy: dict[str, float] = {}
    rtt: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "jodl_node_slots_busy":
                busy[sample.labels["node"]] = sample.value
            elif sample.name == "jodl_node_round_trip_seconds":
                rtt[sample.labels["node"]] = sample.value
    return {node: (busy[node], rtt.get(node, 0.0)) for node in busy}


def snapshot(store: Any, settings: Settings) -> Snapshot:
    from ..agent.keys import ops_token
    from ..log.models import utcnow
    from ..ops.status import collect

    live = _live_nodes(settings.metrics_listen, ops_token(settings))
    return Snapshot(utcnow(), collect(store), live)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{sec:02d}s"


def render(snap: Snapshot) -> Any:
    """The live view of ``snap`` as a rich renderable (tables of runs, nodes, queue)."""
    from rich.console import Group
    from rich.table import Table

    runs = Table(title="runs running", expand=False)
    for column in ("run", "done/total", "failed", "dead", "rate", "ETA", "makespan so far"):
        runs.add_column(column, justify="right" if column != "run" else "left")
    for r in snap.data["runs"]:
        if r["state"] != "running":
            continue
        elapsed = (snap.at - r["started_at"]).total_seconds() if r["started_at"] else None
        done, total = r["jobs_done"], r["jobs_total"]
        rate = done / elapsed if elapsed and elapsed > 0 else 0.0
        left = max(0, total - done - r["jobs_dead"])
        eta = left / rate if rate > 0 else None
        runs.add_row(
            f"{r['family']}#{r['number']}",
            f"{done}/{total}",
            str(r["jobs_failed"]),
            str(r["jobs_dead"]),
            f"{rate:.1f}/s",
            _duration(eta),
            _duration(elapsed),
        )
    nodes = Table(title="nodes")
    for column in ("node", "state", "slots busy", "round trip", "learned speed"):
        nodes.add_column(column, justify="left" if column in ("node", "state") else "right")
    for n in snap.data["nodes"]:
        busy, rtt = snap.live.get(n["address"], (None, None))
        nodes.add_row(
            n["address"],
            n["state"],
            f"{busy:.0f}/{n['slots']}" if busy is not None else f"?/{n['slots']}",
            f"{rtt * 1000:.1f} ms" if rtt is not None else "-",
            f"{n['speed']:.2f}",
        )
    queue = Table(title="on-demand queue")
    for column in ("family", "queued", "running", "overdue", "dead", "done"):
        queue.add_column(column, justify="left" if column == "family" else "right")
    for name, c in sorted(snap.data.get("queue", {}).items()):
        queue.add_row(name, *(str(c[k]) for k in ("queued", "running", "overdue", "dead", "done")))
    stamp = snap.at.strftime("%H:%M:%S UTC")
    return Group(f"[bold]JODL status[/bold] {stamp}", runs, nodes, queue)


def watch_status(store: Any, settings: Settings, interval: float = 1.0) -> None:
    """Refresh the live view every ``interval`` seconds until Ctrl-C."""
    from rich.live import Live

    with Live(render(snapshot(store, settings)), auto_refresh=False) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(render(snapshot(store, settings)), refresh=True)
        except KeyboardInterrupt:
            pass


__all__ = [
    "Snapshot",
    "check_peer",
    "fetch_profile",
    "register",
    "render",
    "snapshot",
    "watch_status",
]
