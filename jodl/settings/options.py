"""Declared settings: the :class:`Option` record, its value kinds, the optional TOML
file, and the one registry of every installed package's options.

The library's own options are declared in :mod:`jodl.settings.config`; a module of the library
or of an application declares more with :func:`register_options` and names itself in
the entry-point group ``jodl.options``, so the table (``jodl config``, the README) and
the check of a config file's keys see every installed option, whichever modules a
process happened to import.
"""

from __future__ import annotations

import logging
import sys
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..exceptions import ConfigError
from ..obs import tracing

log = logging.getLogger("jodl.settings.config")


def _bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true/false, got {text!r}")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise ValueError(f"expected a positive integer, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise ValueError(f"expected a positive number, got {text!r}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"expected a number between 0 and 1, got {text!r}")
    return value


def host_port(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return text


def listen_address(text: str) -> str:
    """HOST:PORT to listen on; port 0 lets the system pick a free one."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"expected HOST:PORT (port 0: any free port), got {text!r}")
    return text


def _optional_str(text: str) -> str | None:
    return text or None


#: Names JODL_LOG_LEVEL accepts (any case).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level(text: str) -> str:
    level = text.strip().upper()
    if level not in LOG_LEVELS:
        raise ValueError(f"expected one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return level


#: Event loops an agent may run async families on (JODL_AGENT_LOOP).
EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def _event_loop(text: str) -> str:
    kind = text.strip().lower()
    if kind not in EVENT_LOOPS:
        raise ValueError(f"expected one of {', '.join(EVENT_LOOPS)}, got {text!r}")
    return kind


def _optional_positive_float(text: str) -> float | None:
    return _positive_float(text) if text.strip() else None


def _log_format(text: str) -> str:
    fmt = text.strip().lower()
    if fmt not in ("text", "json"):
        raise ValueError(f"expected text or json, got {text!r}")
    return fmt


def _str_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


PARSERS: dict[str, Callable[[str], Any]] = {
    "str": str,
    "str?": _optional_str,
    "bool": _bool,
    "int+": _positive_int,
    "float+": _positive_float,
    "float+?": _optional_positive_float,
    "fraction": _fraction,
    "host:port": host_port,
    "list": _str_list,
    "level": _log_level,
    "loop": _event_loop,
    "logfmt": _log_format,
    "traces": tracing.parse,
}


@dataclass(frozen=True)
class Option:
    """One setting: its ``JODL_`` variable, default (as text), kind, meaning and readers."""

    name: str
    default: str
    kind: str
    help: str
    programs: str

    @property
    def attr(self) -> str:
        return self.name.removeprefix("JODL_").lower()

    def parse(self, text: str) -> Any:
        try:
            return PARSERS[self.kind](text)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"{self.name}: {exc}") from None


def read_file(path: str) -> dict[str, str]:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"JODL_CONFIG: no such file {path!r}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"JODL_CONFIG: {path!r} is not valid TOML: {exc}") from None
    out: dict[str, str] = {}
    for key, value in data.items():
        name = "JODL_" + key.upper().removeprefix("JODL_")
        if isinstance(value, dict):
            raise ConfigError(f"JODL_CONFIG: {key!r} in {path!r} is a table; expected a value")
        if isinstance(value, list):
            value = ",".join(str(item) for item in value)  # the "list" kind's text form
        out[name] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


#: Options added by modules other than :mod:`jodl.settings.config`: declaring module -> its options.
_EXTRA: dict[str, list[Option]] = {}
#: Entry-point group naming the modules that declare options when imported.
OPTIONS_GROUP = "jodl.options"
_declared_loaded = False


def register_options(options: Iterable[Option], module: str | None = None) -> None:
    """Let a module (of the library or an application) add its options to the one table.

    ``module`` is the declaring module's name (None: the caller's); the table lists the
    library's options first, then the others by module name, each in declaration order.
    An option whose name is already registered is left out.
    """
    if module is None:
        module = str(sys._getframe(1).f_globals.get("__name__", ""))
    known = {o.name for o in registered_options()}
    for opt in options:
        if opt.name not in known:
            _EXTRA.setdefault(module, []).append(opt)
            known.add(opt.name)


def _module_rank(module: str) -> tuple[int, str]:
    # The table must not depend on which module a process happened to import first.
    return (0 if module.partition(".")[0] == "jodl" else 1), module


#: Checks across a module's settings (e.g. a network list, TLS with a password), each
#: given the environment and raising :class:`ConfigError`: ``jodl config`` runs them all.
_CHECKS: list[Callable[[Any], None]] = []


def register_check(check: Callable[[Any], None]) -> None:
    """Let a module add the checks its settings need beyond each value's type: called
    by ``jodl config`` with the environment (a mapping), it raises :class:`ConfigError`
    naming the variable."""
    if check not in _CHECKS:
        _CHECKS.append(check)


def registered_checks() -> tuple[Callable[[Any], None], ...]:
    return tuple(_CHECKS)


def registered_options() -> tuple[Option, ...]:
    """The options registered so far, in the table's order."""
    return tuple(opt for module in sorted(_EXTRA, key=_module_rank) for opt in _EXTRA[module])


def load_declared_options() -> None:
    """Import, once, every module named in the ``jodl.options`` entry-point group."""
    global _declared_loaded
    if _declared_loaded:
        return
    _declared_loaded = True
    from .plugins import load_group

    load_group(OPTIONS_GROUP)  # importing each module registers its options


def markdown_table(options: Iterable[Option]) -> str:
    """The configuration table of ``options`` (the README's), in Markdown."""
    rows = ["| variable | default | meaning | read by |", "|---|---|---|---|"]
    for opt in options:
        default = f"`{opt.default}`" if opt.default else "(empty)"
        rows.append(f"| `{opt.name}` | {default} | {opt.help} | {opt.programs} |")
    return "\n".join(rows)


__all__ = [
    "OPTIONS_GROUP",
    "Option",
    "register_check",
    "register_options",
    "registered_checks",
    "registered_options",
]
