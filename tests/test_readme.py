"""The README's family example, run as written: its family installed on a real agent,
its jobs added and its results read with the README's own Python blocks."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
from pathlib import Path

from agents import child_env, run_jodl

README = Path(__file__).resolve().parent.parent / "README.md"


def blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", README.read_text(), re.S | re.M)


def block_with(language: str, needle: str) -> str:
    (found,) = [b for b in blocks(language) if needle in b]
    return found


def install_family(site: Path) -> None:
    """The README's family module and entry point, installed as a distribution on ``site``."""
    package = site / "mypackage"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "families.py").write_text(block_with("python", "class Resize"))
    config = configparser.ConfigParser()
    config.read_string(block_with("ini", "jodl.families"))
    dist = site / "mypackage-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: mypackage\nVersion: 1.0\n")
    groups = config["options.entry_points"]
    (dist / "entry_points.txt").write_text(
        "".join(f"[{group}]\n{lines.strip()}\n" for group, lines in groups.items())
    )


def python(code: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_readme_example_runs_as_written(tmp_path: Path, spawn_agent) -> None:
    site = tmp_path / "site"
    install_family(site)
    env = {"PYTHONPATH": str(site), "JODL_DATABASE_URL": f"sqlite:///{tmp_path / 'jodl.db'}"}
    python(block_with("python", "jodl.add_jobs("), tmp_path, env)
    agent = spawn_agent(env=env)
    assert run_jodl("node", "add", agent.address, env=env).returncode == 0
    run = run_jodl("run", "resize", env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    out = python(block_with("python", "jodl.results("), tmp_path, env)
    assert sorted(out.splitlines()) == ["photo-1 done {'pixels': 6}", "photo-2 done {'pixels': 20}"]
    cli = run_jodl("results", "resize", env=env, cwd=tmp_path)
    assert cli.stdout.splitlines() == [
        'photo-1\tdone\t{"pixels": 6}',
        'photo-2\tdone\t{"pixels": 20}',
    ]
