"""Progress of a long command: a rich bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click

#: ``on_step(name)`` starts a named step; ``progress(done, total)`` reports within it.
Reporters = tuple[Callable[[str], None], Callable[[int, int], None]]


@contextmanager
def progress_reporters(label: str) -> Iterator[Reporters]:
    """Yield ``(on_step, progress)`` callbacks; plain output prints about every tenth."""
    if sys.stdout.isatty():
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

        with Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        ) as bar:
            task = bar.add_task(label, total=None)

            def on_step(step: str) -> None:
                bar.update(task, description=step.replace("_", " "), completed=0, total=None)

            def progress(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            yield on_step, progress
        return
    state: dict[str, object] = {"step": label, "last": -1}

    def plain_step(step: str) -> None:
        state["step"], state["last"] = step.replace("_", " "), -1
        click.echo(f"step {state['step']}")

    def plain_progress(done: int, total: int) -> None:
        tenth = max(1, total // 10)
        if done // tenth != state["last"] or done == total:
            state["last"] = done // tenth
            click.echo(f"{state['step']}: {done}/{total}")

    yield plain_step, plain_progress
