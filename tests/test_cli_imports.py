"""Building the ``jodl`` command tree imports no database, network or web module.

``jodl --help`` must answer at once: the commands import what they need when they run.
This checks the import graph (which modules a fresh ``import jodl.cli`` loads), not a time.
"""

from __future__ import annotations

import subprocess
import sys

#: Top-level packages a fresh ``import jodl.cli`` must not load.
HEAVY = ("sqlalchemy", "rpyc", "flask", "httpx", "rich", "prometheus_client", "apscheduler")


def imported_by(statement: str) -> set[str]:
    """The top-level packages a fresh interpreter imports to run ``statement``."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    names = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().partition(".")[0])
    return names


def test_importing_the_cli_loads_no_heavy_module() -> None:
    loaded = imported_by("import jodl.cli")
    assert "jodl" in loaded and "click" in loaded, "the import graph was read"
    assert sorted(loaded & set(HEAVY)) == []


def test_the_help_lists_the_applications_commands_without_loading_them() -> None:
    statement = (
        "import sys; from click.testing import CliRunner; from jodl.cli import main; "
        "out = CliRunner().invoke(main, ['--help']).output; "
        "assert ' up ' in out and ' cycle ' in out, out"
    )
    assert sorted(imported_by(statement) & set(HEAVY)) == []
