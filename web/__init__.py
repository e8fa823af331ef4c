"""The Flask web UI of JODL and its page checker: ``create_app(settings)``."""

from .app import create_app as create_app
from .settings import WebSettings as WebSettings

__all__ = ["WebSettings", "create_app"]
