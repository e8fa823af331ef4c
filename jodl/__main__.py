"""``python -m jodl`` is the ``jodl`` command."""

from .cli import main

main()
