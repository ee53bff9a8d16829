"""Command help that reads well at any width (80 columns included).

typer's "rich" markup mode keeps every line break of a docstring, so a paragraph written at
the source's 100 columns prints at 80 as a wrapped line plus an orphaned stub ("…and bits" /
"per byte; …"). `reflow` joins the lines of each prose paragraph so that rich wraps it to
the terminal; an Examples block (or any paragraph whose lines after the first are indented)
keeps its lines as written.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def reflow(doc: str) -> str:
    """The docstring with each prose paragraph on one line; blocks kept line for line."""
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(p if _is_block(p) else " ".join(line.strip() for line in p.split("\n"))
                       for p in paragraphs)


def _is_block(paragraph: str) -> bool:
    first, *rest = paragraph.split("\n")
    return (first.startswith("\b") or first.strip() in ("[bold]Examples[/bold]", "Examples")
            or (bool(rest) and all(line.startswith(" ") for line in rest)))


def reflowed(fn: F) -> F:
    """Decorator for a command function: its docstring, as typer shows it, reflowed."""
    if fn.__doc__:
        fn.__doc__ = reflow(fn.__doc__)
    return fn


def reflow_tree(typer_app: Any) -> None:
    """Reflow the help of every command and sub-app registered on a typer app (once all
    commands are registered: typer reads the docstrings when it builds the click tree)."""
    for info in typer_app.registered_commands:
        if info.help:
            info.help = reflow(info.help)
        elif info.callback is not None:
            reflowed(info.callback)
    for group in typer_app.registered_groups:
        reflow_tree(group.typer_instance)


__all__ = ["reflow", "reflow_tree", "reflowed"]
