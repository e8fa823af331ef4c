"""The README's configuration table is the one the code declares."""

from __future__ import annotations

import re
from pathlib import Path

from jodl.config import markdown_table

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
