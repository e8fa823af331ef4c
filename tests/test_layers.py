"""The layers hold: module-level imports (``TYPE_CHECKING`` ones included) form no
circle, and no layer imports one above it (docs/architecture.md#parts-and-layering).

The sources are read with :mod:`ast`, nothing is imported. ``from pkg import name``
depends on the submodule ``pkg.name`` when there is one, else on ``pkg`` itself.
Imports inside functions are not module-level and are not counted, except in the web
app, where they form no circle either (none hides a circle the factory would close).

Each application has one gateway: the web app imports the page checker's package
``crawler_app`` (the names of its ``__all__``), never one of its modules, wherever the
import is, as the applications import jodl's public modules only (tests/test_layering.py).
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("jodl", "crawler_app", "web")

#: From the bottom up: a module of a layer imports nothing of the layers above it.
#: ``jodl``'s own layers by module prefix (a longer prefix wins); the applications
#: sit above the whole library, the web UI above the page checker.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("jodl.obs", "jodl.exceptions", "jodl.failpoint"),
    ("jodl.settings", "jodl.family"),
    ("jodl.placement",),
    ("jodl.log",),
    ("jodl.agent",),
    ("jodl.master",),
    ("jodl.queue",),
    ("jodl.admin", "jodl.ops"),  # administration and operations through the database
    ("jodl.cli",),
    ("jodl",),  # the public face
    ("crawler_app",),
    ("web",),
)

#: Each importer package -> the package it may reach only through that package's ``__all__``.
GATEWAYS = {"web": "crawler_app"}

#: Circles left to break: none, and none may be added (``TYPE_CHECKING`` imports count).
KNOWN_CIRCLES: set[frozenset[str]] = set()


def module_files() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def module_level_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):  # TYPE_CHECKING and the like
            yield from module_level_imports(node.body)
            yield from module_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody):
                yield from module_level_imports(block)
            for handler in node.handlers:
                yield from module_level_imports(handler.body)


def all_imports(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import of ``body``, those inside functions and classes too."""
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Import | ast.ImportFrom):
                yield node


def dependencies(
    body: list[ast.stmt], package: str, files: Collection[str], *, everywhere: bool = False
) -> set[str]:
    """The modules of ``files`` that module-level imports of ``body`` (in ``package``)
    load, or with ``everywhere`` all its imports: ``from pkg import name`` loads
    ``pkg.name`` when that is a module, else ``pkg``."""
    deps: set[str] = set()
    for node in (all_imports if everywhere else module_level_imports)(body):
        if isinstance(node, ast.Import):
            deps.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            parts = parts[: len(parts) - (node.level - 1)]
            base = ".".join([*parts, *([node.module] if node.module else [])])
        subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in files]
        deps.update(subs)
        if len(subs) < len(node.names):
            deps.add(base)
    return {d for d in deps if d in files}


def import_graph(*, everywhere: bool = False) -> dict[str, set[str]]:
    """Each module's dependencies: module-level imports, or with ``everywhere`` all."""
    files = module_files()
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        body = ast.parse(path.read_text()).body
        graph[name] = dependencies(body, package, files, everywhere=everywhere) - {name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layer_of(module: str) -> int:
    best, found = -1, 0
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best:
                best, found = len(prefix), level
    return found


def test_no_module_level_circle_but_the_known_ones() -> None:
    found = circles(import_graph())
    assert set(found) <= KNOWN_CIRCLES, [sorted(c) for c in found if c not in KNOWN_CIRCLES]


def test_the_web_app_has_no_circle_even_through_imports_inside_functions() -> None:
    """No blueprint imports the factory, nor a function of the factory a blueprint that
    imports it back: the shared services live in ``web.services``, below both."""
    graph = import_graph(everywhere=True)
    web = {m: {d for d in deps if d == "web" or d.startswith("web.")} for m, deps in graph.items()}
    web = {m: deps for m, deps in web.items() if m == "web" or m.startswith("web.")}
    assert "web.app" in web["web"], "imports inside functions are missing"  # __getattr__
    assert [sorted(c) for c in circles(web)] == []


def test_no_layer_imports_a_higher_one() -> None:
    graph = import_graph()
    upward = [
        f"{m} -> {d}"
        for m, deps in sorted(graph.items())
        for d in sorted(deps)
        if layer_of(d) > layer_of(m)
    ]
    assert upward == []


def test_metric_declarations_import_nothing_of_jodl() -> None:
    assert import_graph()["jodl.obs.metrics"] == set()


@pytest.mark.parametrize(
    "source, deps",
    [
        ("from . import budgets", {"jodl.log.budgets"}),
        ("from .store import Store", {"jodl.log.store"}),
        ("from .. import failpoint", {"jodl.failpoint"}),
        ("if TYPE_CHECKING:\n    from ..master import Master", {"jodl.master"}),
        ("def later():\n    from ..master import Master", set()),
    ],
)
def test_the_graph_reads_imports_as_python_does(source: str, deps: set[str]) -> None:
    found = dependencies(ast.parse(source).body, "jodl.log", module_files())
    assert found == deps


@pytest.mark.parametrize(
    "source, deps",
    [
        ("def later():\n    from ..master import Master", {"jodl.master"}),
        ("class Later:\n    def run(self):\n        from . import budgets", {"jodl.log.budgets"}),
        ("from .store import Store", {"jodl.log.store"}),
    ],
)
def test_everywhere_counts_the_imports_inside_functions(source: str, deps: set[str]) -> None:
    found = dependencies(ast.parse(source).body, "jodl.log", module_files(), everywhere=True)
    assert found == deps


# -- the web app's SQL lives in its gateway ----------------------------------------------------

#: The web app's modules that may build SQL (docs/architecture.md#the-applications).
WEB_SQL_GATEWAYS = frozenset({"web.queries"})
#: Packages of the web app outside the rule: its schema's migrations (Alembic's DDL).
WEB_SQL_EXEMPT = ("web.migrations.",)
#: What of SQLAlchemy builds or runs statements (types, engines, sessions and errors are free).
WEB_SQL_BUILDERS = frozenset(
    {
        "select", "update", "insert", "delete", "text", "func", "inspect", "literal",
        "literal_column", "column", "table", "and_", "or_", "not_", "exists", "union",
        "union_all", "bindparam", "case", "cast", "distinct", "null", "true", "false", "tuple_",
    }
)  # fmt: skip
#: Methods that run statements on a connection or session.
WEB_SQL_RUNNERS = frozenset({"execute", "exec_driver_sql", "scalar", "scalars", "query"})


def web_sql_outside_gateway(tree: ast.Module) -> list[str]:
    """What of ``tree`` builds or runs SQL: imports of SQLAlchemy's statement builders
    (inside functions too) and calls of the methods that run statements."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [
                f"import {a.name}"
                for a in node.names
                if a.name == "sqlalchemy"
                or a.name.startswith(("sqlalchemy.sql", "sqlalchemy.dialects"))
            ]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sqlalchemy"):
            module = node.module or ""
            if module.startswith(("sqlalchemy.sql", "sqlalchemy.dialects")):
                found.append(f"from {module} import ...")
            found += [
                f"from {module} import {a.name}"
                for a in node.names
                if a.name in WEB_SQL_BUILDERS or a.name == "sql"
            ]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in WEB_SQL_RUNNERS
        ):
            found.append(f"line {node.lineno}: .{node.func.attr}(...)")
    return found


def test_no_web_module_but_its_gateway_builds_sql() -> None:
    """Every statement of the web app is a named function of ``web.queries``; the
    other web modules call those (crawler_app's own functions are theirs to use)."""
    offenders = {
        name: found
        for name, path in module_files().items()
        if (name == "web" or name.startswith("web."))
        and name not in WEB_SQL_GATEWAYS
        and not name.startswith(WEB_SQL_EXEMPT)
        and (found := web_sql_outside_gateway(ast.parse(path.read_text())))
    }
    assert offenders == {}
    assert WEB_SQL_GATEWAYS <= module_files().keys()


@pytest.mark.parametrize(
    "source, found",
    [
        ("from sqlalchemy import Engine, select", ["from sqlalchemy import select"]),
        ("def f():\n    from sqlalchemy import text", ["from sqlalchemy import text"]),
        ("import sqlalchemy as sa", ["import sqlalchemy"]),
        ("from sqlalchemy.sql import expression", ["from sqlalchemy.sql import ..."]),
        ("with e.connect() as c:\n    c.execute(q)", ["line 2: .execute(...)"]),
        ("from sqlalchemy.orm import Session, sessionmaker", []),
        ("from sqlalchemy.exc import SQLAlchemyError", []),
        ("x = queries.user_by_email(s, a)", []),
    ],
)
def test_the_web_sql_scan_sees_builders_and_runners(source: str, found: list[str]) -> None:
    assert web_sql_outside_gateway(ast.parse(source)) == found


def public_face(package: str) -> set[str]:
    """The names of the ``__all__`` of ``package``, read from its ``__init__.py``."""
    tree = ast.parse((ROOT / package / "__init__.py").read_text())
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets
        ):
            return set(ast.literal_eval(stmt.value))
    return set()


def past_the_gateway(source: str, gateway: str, where: str) -> Iterator[str]:
    """Each import of ``source`` (inside functions too) that reaches ``gateway`` other
    than by a name of its ``__all__``, described."""
    face = public_face(gateway)
    for node in all_imports(ast.parse(source).body):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.partition(".")[0] == gateway:
                    yield f"{where}:{node.lineno}: import {alias.name}"
        elif node.level == 0 and node.module and node.module.partition(".")[0] == gateway:
            if node.module != gateway:
                yield f"{where}:{node.lineno}: from {node.module} (a module of {gateway})"
                continue
            for alias in node.names:
                if alias.name not in face:
                    yield f"{where}:{node.lineno}: {gateway}.{alias.name} is not in its __all__"


def test_the_web_app_reaches_the_page_checker_through_its_package_only() -> None:
    found = []
    for importer, gateway in GATEWAYS.items():
        for path in sorted((ROOT / importer).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            found += past_the_gateway(path.read_text(), gateway, where)
    assert found == []


def test_the_page_checkers_face_lists_what_it_loads() -> None:
    """Every public name of ``crawler_app`` is one of its lazy names (nothing imported)."""
    tree = ast.parse((ROOT / "crawler_app" / "__init__.py").read_text())
    lazy = next(
        stmt.value
        for stmt in tree.body
        if isinstance(stmt, ast.AnnAssign)
        and isinstance(stmt.target, ast.Name)
        and stmt.target.id == "_PUBLIC"
    )
    assert isinstance(lazy, ast.Dict)
    names = {ast.literal_eval(key) for key in lazy.keys if key is not None}
    assert names == public_face("crawler_app")


@pytest.mark.parametrize(
    "source",
    [
        "from crawler_app.pages import track",
        "import crawler_app.settings",
        "from crawler_app import not_public",
        "def later():\n    from crawler_app.models import User",
    ],
)
def test_an_import_past_the_gateway_is_caught(source: str) -> None:
    assert list(past_the_gateway(source, "crawler_app", "example")) != []


@pytest.mark.parametrize(
    "source",
    [
        "from crawler_app import User, track, feeds",
        "def later():\n    from crawler_app import AppSettings",
        "from jodl.log import Store\nfrom .models import Batch",
    ],
)
def test_an_import_through_the_gateway_passes(source: str) -> None:
    assert list(past_the_gateway(source, "crawler_app", "example")) == []


#: What builds SQL: these names of ``sqlalchemy`` imported, anywhere in a module.
SQL_NAMES = {"select", "insert", "update", "delete", "exists", "func", "text", "bindparam"}

#: The page checker's gateways: its modules that build SQL for the others.
SQL_GATEWAYS = {
    "crawler_app.users.pages",  # users, pages, trackings and their jobs
    "crawler_app.users.quota",  # the users' quotas
    "crawler_app.fetching.queries",  # who a fetch is for (the allowlist's users)
    "crawler_app.checking.queries",  # the cycle, the scheduler, the analysis, the baselines
    "crawler_app.checking.cycle_requests",  # cycles asked through the database
    "crawler_app.notify.queries",  # the digests', channels' and feeds' statements
    "crawler_app.notify.claims",  # the digests' claims, on the agents
    "crawler_app.porting.store",  # import and export: the gateway of the trackings it moves
}


def builds_sql(body: list[ast.stmt]) -> bool:
    return any(
        isinstance(node, ast.ImportFrom)
        and (node.module or "").partition(".")[0] == "sqlalchemy"
        and any(alias.name in SQL_NAMES for alias in node.names)
        for node in all_imports(body)
    )


def test_the_page_checker_builds_sql_in_its_gateways_only() -> None:
    found = {
        name
        for name, path in module_files().items()
        if name.startswith("crawler_app.")
        and ".migrations" not in name
        and builds_sql(ast.parse(path.read_text()).body)
    }
    assert "crawler_app.checking.queries" in found, "the SQL builders were found"
    assert sorted(found - SQL_GATEWAYS) == []
