"""Rewrite the README's configuration table from the declared options (``jodl config``)."""

from __future__ import annotations

import re
from pathlib import Path

from jodl.settings.config import markdown_table

README = Path(__file__).resolve().parent.parent / "README.md"


def main() -> None:
    text = README.read_text()
    new = re.sub(
        r"(<!-- config:start[^>]*-->\n)(.*?)(<!-- config:end -->)",
        lambda m: m.group(1) + markdown_table().strip() + "\n" + m.group(3),
        text,
        flags=re.S,
    )
    README.write_text(new)


if __name__ == "__main__":
    main()
