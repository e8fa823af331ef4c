"""Entry points of installed packages: those naming an extra load only with the extra.

A fresh interpreter sees a small distribution written to a temporary site directory:
its ``jodl.commands`` entry points need an extra whose requirement is installed (or not).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from agents import child_env


def make_site(site: Path, requirement: str) -> None:
    """A distribution ``plugdemo`` whose entry point needs its extra ``more``."""
    package = site / "plugdemo"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("def register(group):\n    group.append('loaded')\n")
    dist = site / "plugdemo-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: plugdemo\nVersion: 1.0\nProvides-Extra: more\n"
        f'Requires-Dist: {requirement}; extra == "more"\n'
    )
    (dist / "entry_points.txt").write_text("[jodl.test_plugins]\ndemo = plugdemo:register [more]\n")


def loaded(site: Path) -> str:
    script = (
        "from jodl.settings.plugins import load_group; "
        "print([ep.name for ep, _ in load_group('jodl.test_plugins')])"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=child_env({"PYTHONPATH": str(site)}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_an_entry_point_loads_when_its_extra_is_installed(tmp_path: Path) -> None:
    make_site(tmp_path, "click>=8")  # installed wherever jodl is
    assert loaded(tmp_path) == "['demo']"


def test_an_entry_point_is_left_out_without_its_extra(tmp_path: Path) -> None:
    make_site(tmp_path, "no-such-distribution-here>=1")
    assert loaded(tmp_path) == "[]"
