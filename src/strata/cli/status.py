"""Progress of the kernel lab's and train's long commands, under `--progress/--no-progress`.

On a terminal a live status line (rich's spinner); piped or logged, where the live line
shows nothing, each new message once as a plain line ("verified 3/12: rmsnorm/c.avx2
pass"), so a CI log shows how far a long command got; with --no-progress (or
STRATA_PROGRESS=0) nothing. Messages are rich markup with the user's text escaped, as
err.status takes them.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from strata.views.console import progress_enabled, set_progress

OUTPUT_PANEL = "Output"  # -o and --progress in a panel of their own, as `strata bench` has them:
# the wide --no-progress column would otherwise narrow every other option's help at 80 columns

ProgressOption = Annotated[bool | None, typer.Option(
    "--progress/--no-progress", show_default=False, rich_help_panel=OUTPUT_PANEL,
    help="Progress on stderr: live on a terminal, plain lines otherwise.")]


def use_progress(value: bool | None) -> None:
    """A command's own --progress/--no-progress; None keeps the root's (or the default)."""
    if value is not None:
        set_progress(value)


class _Lines:
    """err.status's API (update, context manager) as one plain line per new message."""

    def __init__(self, console: Console, message: str, quiet: bool = False) -> None:
        self.console, self.quiet, self.last = console, quiet, ""
        self.update(message)

    def update(self, message: str) -> None:
        text = Text.from_markup(message).plain
        if self.quiet or text == self.last:
            return
        self.last = text
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *_exc: object) -> None:
        return None


def status(console: Console, message: str, lines: bool = True) -> Any:
    """A live status on a terminal, plain lines elsewhere (`lines=False`: nothing there,
    for a status that changes too often to log), nothing with --no-progress."""
    if not progress_enabled():
        return _Lines(console, message, quiet=True)
    if console.is_terminal:
        return console.status(message)
    return _Lines(console, message, quiet=not lines)


__all__ = ["OUTPUT_PANEL", "ProgressOption", "status", "use_progress"]
