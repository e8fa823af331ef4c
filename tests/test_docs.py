"""The README's configuration table is the one the code declares."""

from __future__ import annotations

import re
from pathlib import Path

from jodl.settings.config import markdown_table

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_table() -> str:
    text = README.read_text()
    match = re.search(r"<!-- config:start[^>]*-->\n(.*?)<!-- config:end -->", text, re.S)
    assert match, "README.md lost its configuration table markers"
    return match.group(1).strip()


def test_readme_config_table_matches_the_declared_options() -> None:
    assert readme_table() == markdown_table().strip(), (
        "README configuration table is stale: regenerate it with `python scripts/update_readme.py`"
    )


ARCHITECTURE = README.parent / "docs" / "architecture.md"
#: A path of the tree as the docs name it: `jodl/...`, `crawler_app/...` or `web/...`.
NAMED_PATH = re.compile(r"(?<![\w./-])((?:jodl|crawler_app|web)/[\w./*-]*[\w/])")


def named_paths(text: str) -> set[str]:
    return {p.rstrip("/") for p in NAMED_PATH.findall(text)}


def module_map() -> str:
    match = re.search(r"## How it fits together\n+```\n(.*?)```", README.read_text(), re.S)
    assert match, "README.md lost its module map"
    return match.group(1)


def test_every_path_named_in_docs_architecture_exists() -> None:
    root = README.parent
    named = named_paths(ARCHITECTURE.read_text())
    missing = sorted(p for p in named if not any(root.glob(p)))
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_readme_module_map_matches_the_tree() -> None:
    """Every module the map names exists under the package it is listed in, and every
    package of jodl is named."""
    root = README.parent
    missing = []
    stack: list[tuple[int, Path]] = []
    for line in module_map().splitlines():
        indent = len(line) - len(line.lstrip())
        words = line.split()
        if not words:
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        base = stack[-1][1] if stack else root
        first = words[0].rstrip(",")
        if first.endswith("/"):
            folder = base / first.rstrip("/")
            if not folder.is_dir():
                missing.append(str(folder.relative_to(root)))
            stack.append((indent, folder))
            continue
        # Leading names of a line, e.g. "runs.py, outcomes.py   what they are".
        for word in words:
            name = word.rstrip(",")
            if not re.fullmatch(r"[\w*]+\.py", name):
                break
            found = list(base.glob(name))
            if not found:
                missing.append(str((base / name).relative_to(root)))
            if not word.endswith(","):
                break
    assert not missing, f"the README's module map names what is not in the tree: {missing}"
    packages = {
        str(p.parent.relative_to(root)) + "/"
        for p in (root / "jodl").rglob("__init__.py")
        if ".venv" not in p.parts
    }
    text = module_map()
    unnamed = sorted(p for p in packages if p.split("/")[-2] + "/" not in text)
    assert not unnamed, f"the README's module map does not name these packages: {unnamed}"


def test_every_pointer_to_a_section_of_docs_architecture_finds_it() -> None:
    root = README.parent
    headings = re.findall(r"^#+ (.+)$", ARCHITECTURE.read_text(), re.M)
    anchors = {re.sub(r"[^\w -]", "", h).strip().lower().replace(" ", "-") for h in headings}
    files = [README, *root.glob("docs/*.md")]
    for package in ("jodl", "crawler_app", "web", "tests", "bench"):
        files += (root / package).rglob("*.py")
    wrong = {
        f"{path.relative_to(root)}: #{anchor}"
        for path in files
        for anchor in re.findall(r"architecture\.md#([\w-]+)", path.read_text())
        if anchor not in anchors
    }
    assert not wrong, f"pointers to sections docs/architecture.md does not have: {sorted(wrong)}"
