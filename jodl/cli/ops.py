"""Operators' commands: ``jodl profile`` and the live view of ``jodl status --watch``.

``status --watch`` reads the database (runs, nodes, queue; a running run's counts
are written by its master about once a second) and, from the ops endpoint of each
live master (the address in its heartbeat row; ``JODL_METRICS_LISTEN`` when none
says one), its per-node slots busy and round trips from ``/metrics``.

Both first ask the endpoint to prove it holds this cluster's ops token
(:func:`check_peer`): any local user may bind a port first, and a process that
cannot prove it is ours gets nothing, neither a token nor our trust in its numbers.
``status --watch`` also checks the endpoint's cluster id against its database's and
refuses, in one line, a process that says it belongs to another cluster.
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


class OtherCluster(JodlError):
    """The ops endpoint asked is a process of another cluster (another database)."""


def check_peer(address: str, role: str, token: str | None, cluster: str | None = None) -> None:
    """:class:`JodlError` unless the ops endpoint at ``address`` is a ``role`` process
    that proves it holds ``token`` (an HMAC of a fresh nonce, its role and cluster id;
    the token is not sent). With ``cluster``, :class:`OtherCluster` when the endpoint
    says another cluster id (checked before anything else is read or sent)."""
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
    theirs = body.get("cluster")
    if cluster is not None and type(theirs) is str and theirs and theirs != cluster:
        raise OtherCluster(
            f"{address} is the {role} of another cluster (cluster id {theirs}, this "
            f"database's is {cluster}): refused, nothing was read or sent"
        )
    if cluster is not None and theirs != cluster:
        raise JodlError(f"{address} did not say it is a {role} of this cluster")
    if token is None:
        return  # nothing to prove, and nothing will be sent
    proof = body.get("proof")
    expected = ops_proof(token, role, nonce, theirs if type(theirs) is str else "")
    if type(proof) is not str or not hmac.compare_digest(proof, expected):
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
    #: node address -> (slots busy, round trip seconds), from the masters' /metrics.
    live: dict[str, tuple[float, float]] = field(default_factory=dict)


def ops_addresses(store: Any, settings: Settings) -> list[str]:
    """The ops endpoints of the live masters, as their heartbeats say; else the
    configured ``JODL_METRICS_LISTEN`` (a master that publishes none)."""
    found = [m.ops for m in store.masters.masters() if m.live and m.ops]
    if found:
        return sorted(set(found))
    return [settings.metrics_listen] if settings.metrics_listen else []


def _live_nodes(
    addresses: list[str], token: str | None, cluster: str
) -> dict[str, tuple[float, float]]:
    """Per-node figures from the masters' /metrics (a node's busy slots summed over the
    masters that lead some of its jobs); none from an endpoint that does not prove it is
    ours, and :class:`OtherCluster` for one of another cluster."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    busy: dict[str, float] = {}
    rtt: dict[str, float] = {}
    for address in addresses:
        try:
            check_peer(address, "master", token, cluster)
            text = httpx.get(f"{_base(address)}/metrics", timeout=1.0).text
        except OtherCluster:
            raise
        except (httpx.HTTPError, JodlError):
            continue
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                node = sample.labels.get("node", "")
                if sample.name == "jodl_node_slots_busy":
                    busy[node] = busy.get(node, 0.0) + sample.value
                elif sample.name == "jodl_node_round_trip_seconds":
                    rtt[node] = max(rtt.get(node, 0.0), sample.value)
    return {node: (busy[node], rtt.get(node, 0.0)) for node in busy}


def snapshot(store: Any, settings: Settings) -> Snapshot:
    from ..agent.keys import ops_token
    from ..log.models import utcnow
    from ..ops.status import collect

    addresses = ops_addresses(store, settings)
    live = _live_nodes(addresses, ops_token(settings), store.cluster_id()) if addresses else {}
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
    "OtherCluster",
    "Snapshot",
    "check_peer",
    "fetch_profile",
    "ops_addresses",
    "register",
    "render",
    "snapshot",
    "watch_status",
]
