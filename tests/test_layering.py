"""The applications use jodl's public API only, and that API lists what it defines.

The public API is the ``__all__`` of each module of :data:`jodl.PUBLIC_MODULES`
(docs/architecture.md#parts-and-layering). The applications' sources are read with :mod:`ast`
(nothing of them is imported); a name with a leading underscore is never public.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest

import jodl

ROOT = Path(__file__).resolve().parent.parent
#: The applications (and the benchmarks, which use jodl the way an application does).
APPS = ("crawler_app", "web", "bench")


def public_names(module: str) -> set[str]:
    """The public names of a public module: its ``__all__``."""
    return set(importlib.import_module(module).__all__)


def violations(source: str, where: str) -> Iterator[str]:
    """Each import of ``source`` that reaches past jodl's public API, described."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.partition(".")[0] == "jodl" and alias.name not in jodl.PUBLIC_MODULES:
                    yield f"{where}:{node.lineno}: import {alias.name} (internal module)"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.partition(".")[0] != "jodl":
                continue
            if node.module not in jodl.PUBLIC_MODULES:
                yield f"{where}:{node.lineno}: from {node.module} (internal module)"
                continue
            exported = public_names(node.module)
            for alias in node.names:
                name = alias.name
                if name.startswith("_") or name == "*":
                    yield f"{where}:{node.lineno}: from {node.module} import {name}"
                elif name not in exported and f"{node.module}.{name}" not in jodl.PUBLIC_MODULES:
                    yield f"{where}:{node.lineno}: {node.module}.{name} is not in its __all__"


def app_sources() -> Iterator[Path]:
    for app in APPS:
        yield from sorted((ROOT / app).rglob("*.py"))


def test_the_applications_import_only_public_names() -> None:
    files = list(app_sources())
    assert len(files) > 20, "the applications were found"
    found = [v for path in files for v in violations(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        "from jodl.log.models import Base",
        "from jodl.log import _private",
        "from jodl.log import table_of",
        "import jodl.agent.wire",
        "from jodl.agent.wire import split_address",
        "from jodl import status",
        "from jodl.log import *",
        "def later():\n    from jodl.admin.requests import RunRequests\n",
    ],
)
def test_an_import_past_the_public_api_is_caught(source: str) -> None:
    assert list(violations(source, "example")) != []


@pytest.mark.parametrize(
    "source",
    [
        "from jodl import Master, RunRequests, failpoint",
        "from jodl.log import Base, Job, Store, utcnow",
        "from jodl.agent import split_address",
        "import jodl.settings.config",
        "from . import jodl_like\nfrom alembic import op",
    ],
)
def test_a_public_import_passes(source: str) -> None:
    assert list(violations(source, "example")) == []


def modules_with_all() -> list[str]:
    """Every module of jodl that declares ``__all__`` (found without importing it)."""
    names = []
    for path in sorted((ROOT / "jodl").rglob("*.py")):
        tree = ast.parse(path.read_text())
        declares = any(
            isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets)
            for stmt in tree.body
        )
        if declares:
            parts = path.relative_to(ROOT).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_public_module_declares_all() -> None:
    assert set(jodl.PUBLIC_MODULES) <= set(modules_with_all())


@pytest.mark.parametrize("module", modules_with_all())
def test_all_lists_only_names_the_module_defines(module: str) -> None:
    loaded = importlib.import_module(module)
    listed = list(loaded.__all__)
    assert len(listed) == len(set(listed)), "no name twice"
    assert [name for name in listed if not hasattr(loaded, name)] == []
    assert [name for name in listed if name.startswith("_")] == []


def test_the_lazy_names_of_jodl_are_its_all() -> None:
    lazy = set(jodl._PUBLIC) | {"PUBLIC_MODULES"}
    assert lazy == set(jodl.__all__)


def test_the_page_checkers_public_names_load() -> None:
    """Every name of ``crawler_app.__all__`` loads (they are lazy: tests/test_layers.py
    holds the web app to them)."""
    import crawler_app

    listed = list(crawler_app.__all__)
    assert len(listed) == len(set(listed)), "no name twice"
    assert [name for name in listed if getattr(crawler_app, name, None) is None] == []
