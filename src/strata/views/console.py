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

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

# Wider than any table strata prints: a width rich never needs to fit a table into. Not
# unbounded, so a runaway cell still wraps (at spaces) rather than building a giant line.
PIPE_WIDTH = 10_000


def make_console(stderr: bool = False) -> Console:
    """stdout (or stderr) console: the terminal's width on a terminal, PIPE_WIDTH otherwise."""
    console = Console(stderr=stderr, emoji=False)
    if not console.is_terminal:
        console.width = PIPE_WIDTH
    return console


def plain(value: object, style: str = "") -> Text:
    """A table cell or line from data: shown verbatim, never parsed as markup or emoji."""
    return value if isinstance(value, Text) else Text(str(value), style=style)


def progress_bar(console: Console) -> Progress:
    """The stderr progress bar of long commands (bench, quality): description, bar, n/N,
    elapsed. The description names the model as typed, so it is plain text, never markup."""
    return Progress(TextColumn("{task.description}", style="bold", markup=False), BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), console=console, transient=True)
