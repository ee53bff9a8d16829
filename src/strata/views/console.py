"""The consoles the CLI prints through, and text that must print as typed.

Width. Piped or redirected, rich assumes 80 columns and squeezes every table into them by
cutting cells ("synthe…", "83,667…") or breaking tokens across lines ("443." / "9664"):
figures that neither a script nor a person reading the log can use. A console whose output
is not a terminal therefore gets a width no table reaches, so each table is laid out at its
natural width: no cell is cut or folded, one row per line (as `ps` does when piped). On a
terminal rich fits the window as before. COLUMNS does not narrow a pipe: the output would
again depend on who runs it.

Text. Emoji codes are off on both consoles: "commit:zzz" must never print as an emoji. Markup
stays on for strata's own styling, so text the user typed or a file named (model names,
commit refs, paths, server messages) reaches rich as `plain(...)` Text or through
`rich.markup.escape`, never as markup: "[bold]x[/bold]" prints as typed and "[/]" cannot
raise a markup error.
"""

from __future__ import annotations

import os
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

# Wider than any table strata prints: a width rich never needs to fit a table into. Not
# unbounded, so a runaway cell still wraps (at spaces) rather than building a giant line.
PIPE_WIDTH = 10_000


def make_console(stderr: bool = False) -> Console:
    """stdout (or stderr) console: the terminal's width on a terminal, PIPE_WIDTH otherwise."""
    from strata.views.narrow import NarrowConsole

    console = NarrowConsole(stderr=stderr, emoji=False)
    if not console.is_terminal:
        console.width = PIPE_WIDTH
    return console


def plain(value: object, style: str = "") -> Text:
    """A table cell or line from data: shown verbatim, never parsed as markup or emoji."""
    return value if isinstance(value, Text) else Text(str(value), style=style)


# How long commands show progress (`--progress/--no-progress`, or STRATA_PROGRESS=0/1):
# None = auto (a live bar on a terminal, plain lines when stderr is a pipe or a log file).
_PROGRESS: bool | None = None


def set_progress(enabled: bool | None) -> None:
    """`--progress` (True), `--no-progress` (False) or auto (None) for this process."""
    global _PROGRESS
    _PROGRESS = enabled


def progress_enabled() -> bool:
    if _PROGRESS is not None:
        return _PROGRESS
    return os.environ.get("STRATA_PROGRESS", "1").strip().lower() not in ("0", "false", "no",
                                                                        "off")


class PlainProgress:
    """The progress bar's API (add_task, update, advance, context manager) as plain lines:
    one line per finished step, "[3/12] model · backend · tg128 · 41.2 s", so a log file or
    a CI console shows how far a long command got. `quiet` prints nothing (--no-progress)."""

    def __init__(self, console: Console, quiet: bool = False) -> None:
        self.console, self.quiet = console, quiet
        self._tasks: dict[int, dict] = {}
        self._start = time.monotonic()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None

    def add_task(self, description: str, total: float | None = None, **_kw: object) -> int:
        task_id = len(self._tasks)
        self._tasks[task_id] = {"description": description, "total": total, "completed": 0}
        return task_id

    def update(self, task_id: int, *, description: str | None = None,
               completed: float | None = None, advance: float | None = None,
               total: float | None = None, **_kw: object) -> None:
        task = self._tasks[task_id]
        if description is not None:
            task["description"] = description
        if total is not None:
            task["total"] = total
        if advance is not None:
            completed = task["completed"] + advance
        if completed is not None and int(completed) > int(task["completed"]):
            task["completed"] = completed
            self._line(task)

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def _line(self, task: dict) -> None:
        if self.quiet:
            return
        total = f"/{int(task['total'])}" if task["total"] else ""
        elapsed = time.monotonic() - self._start
        self.console.print(f"[{int(task['completed'])}{total}] {task['description']} · "
                           f"{elapsed:.1f} s", markup=False, highlight=False, soft_wrap=True)


def progress_bar(console: Console) -> Progress | PlainProgress:
    """The stderr progress of long commands (bench, quality): on a terminal a live bar
    (description, bar, n/N, elapsed); piped, plain lines; nothing with --no-progress. The
    description names the model as typed, so it is plain text, never markup."""
    if not progress_enabled():
        return PlainProgress(console, quiet=True)
    if not console.is_terminal:
        return PlainProgress(console)
    return Progress(TextColumn("{task.description}", style="bold", markup=False), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True)
