"""The Flask web UI of JODL and its page checker: ``create_app(settings)``.

The names load on first use, so that registering the web commands (``jodl --help``)
imports no Flask.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WebSettings", "create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    if name == "WebSettings":
        from .settings import WebSettings

        return WebSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
