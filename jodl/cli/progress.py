"""Progress of a long command: a rich bar on a terminal, plain lines otherwise.

While the bar is shown, log lines are printed through the bar's console (above
the bar, never on its line), and the loggers named in ``quiet`` (those whose
INFO lines repeat what the command itself prints, e.g. the run summary) keep
only warnings.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import click

#: ``on_step(name)`` starts a named step; ``progress(done, total)`` reports within it.
Reporters = tuple[Callable[[str], None], Callable[[int, int], None]]

#: Loggers whose INFO lines a command with progress reports itself (opened, summary).
REPORTED_BY_COMMAND = ("jodl.master",)


class _ConsoleHandler(logging.Handler):
    """Writes log records through a rich console, so they appear above a live bar."""

    def __init__(self, console: Any, formatter: logging.Formatter | None) -> None:
        super().__init__()
        self.console = console
        if formatter is not None:
            self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        from rich.text import Text

        try:
            # A Text, not markup=False: that option would reach the live bar's own render.
            self.console.print(Text(self.format(record)))
        except Exception:  # noqa: BLE001 - logging must not break the command
            self.handleError(record)


@contextmanager
def _quiet(names: tuple[str, ...]) -> Iterator[None]:
    from ..obs.logs import JsonFormatter

    root = logging.getLogger()
    if root.getEffectiveLevel() <= logging.DEBUG or any(
        isinstance(h.formatter, JsonFormatter) for h in root.handlers
    ):
        yield  # asked for everything, or logs for machines: keep every record
        return
    saved = {name: logging.getLogger(name).level for name in names}
    for name in names:
        logging.getLogger(name).setLevel(logging.WARNING)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)


@contextmanager
def _logs_through(console: Any) -> Iterator[None]:
    """Root's stream handlers replaced by one writing through ``console`` meanwhile."""
    root = logging.getLogger()
    streams = [h for h in root.handlers if type(h) is logging.StreamHandler]
    if not streams:
        yield
        return
    handler = _ConsoleHandler(console, streams[0].formatter)
    handler.setLevel(streams[0].level)
    for h in streams:
        root.removeHandler(h)
    root.addHandler(handler)
    try:
        yield
    finally:
        root.removeHandler(handler)
        for h in streams:
            root.addHandler(h)


@contextmanager
def progress_reporters(
    label: str, quiet: tuple[str, ...] = REPORTED_BY_COMMAND
) -> Iterator[Reporters]:
    """Yield ``(on_step, progress)`` callbacks; plain output prints about every tenth."""
    with _quiet(quiet):
        if sys.stdout.isatty():
            with _bar(label) as reporters:
                yield reporters
            return
        yield _plain(label)


@contextmanager
def _bar(label: str) -> Iterator[Reporters]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    with (
        Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        ) as bar,
        _logs_through(bar.console),
    ):
        # One task per step: a step without counts shows none (not the last step's).
        state = {"task": bar.add_task(label, total=None)}

        def on_step(step: str) -> None:
            bar.remove_task(state["task"])
            state["task"] = bar.add_task(step.replace("_", " "), total=None)

        def progress(done: int, total: int) -> None:
            bar.update(state["task"], completed=done, total=total)

        yield on_step, progress
        task = bar.tasks[-1] if bar.tasks else None
        if task is not None and task.total is None:
            bar.remove_task(task.id)  # ended on a step without counts: nothing to show


def _plain(label: str) -> Reporters:
    state: dict[str, object] = {"step": label, "last": -1}

    def plain_step(step: str) -> None:
        state["step"], state["last"] = step.replace("_", " "), -1
        click.echo(f"step {state['step']}")

    def plain_progress(done: int, total: int) -> None:
        tenth = max(1, total // 10)
        if done // tenth != state["last"] or done == total:
            state["last"] = done // tenth
            click.echo(f"{state['step']}: {done}/{total}")

    return plain_step, plain_progress


__all__ = ["REPORTED_BY_COMMAND", "Reporters", "progress_reporters"]
