"""The `strata` command: one thin command per user question (docs/architecture.md §1, §10).

Logic lives in the packages; this file parses flags, calls them, prints, and maps errors
to exit codes: 0 success, 1 failure of the thing measured, 2 usage or input error.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text
from typer.exceptions import Abort, TyperException

from strata import __version__
from strata.errors import InputError, StrataError
from strata.views.console import make_console, set_progress

app = typer.Typer(
    name="strata",
    help="What will run on this machine, how fast, and why: measured, not guessed.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},  # inherited by every command
)
# Piped, both print every table whole at its natural width (views/console.py).
out = make_console()
err = make_console(stderr=True)

DbOption = Annotated[
    Path | None,
    typer.Option("--db", help="Results database file (default: $STRATA_HOME/strata.db or the "
                 "user data dir).", show_default=False),
]


def _version(value: bool) -> None:
    if value:
        out.print(f"strata {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: Annotated[bool, typer.Option("--version", callback=_version,
                                                is_eager=True, help="Print the version.")]
          = False,
          progress: Annotated[bool | None, typer.Option(
              "--progress/--no-progress", show_default=False,
              help="Progress of long commands on stderr: a live bar on a terminal, plain "
              "lines when piped; --no-progress or STRATA_PROGRESS=0 turn it off.")] = None) \
        -> None:
    """strata profiles local-AI hardware: probe, measure, bench, explain."""
    set_progress(progress)


def open_store(db: Path | None):  # -> sqlite3.Connection
    from strata.paths import default_db_path
    from strata.store import open_db

    return open_db(db or default_db_path())


def check_positive(name: str, value: float) -> None:
    if value <= 0:
        raise InputError(f"{name} must be > 0 (got {value})")


def main() -> None:
    """Entry point: every usage/input error becomes one line on stderr and exit code 2."""
    try:
        code = app(standalone_mode=False, prog_name="strata")
    except StrataError as exc:
        _fail(str(exc), exc.exit_code)
    except TyperException as exc:  # usage errors: unknown flag, bad value, unknown command
        if type(exc).__name__ == "NoArgsIsHelpError":
            exc.show()  # `strata` alone prints the help
        else:
            ctx = getattr(exc, "ctx", None)
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            _fail(f"{exc.format_message()}{hint}", exc.exit_code)
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, Abort):
        _fail("interrupted: results finished so far are kept", 130)
    sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str, code: int) -> None:
    # The message quotes what the user typed (a model name, a path): a Text, never markup.
    err.print(Text.assemble(("error:", "bold red"), " ", message), highlight=False,
              soft_wrap=True)
    sys.exit(code)


# The commands register themselves on `app` (and the kernels sub-app) when imported.
from strata.cli import (  # noqa: E402, F401
    bench,
    fleet,
    host,
    kernels,
    kernels_gen,
    models,
    rank,
    ring,
    skills,
    train,
    whatif,
)
from strata.cli.helptext import reflow_tree  # noqa: E402
from strata.cli.metavars import install as install_metavars  # noqa: E402

reflow_tree(app)  # every docstring's prose rewrapped by rich at the terminal's width
install_metavars()  # help shows N, PATH, TYPE, never <str>/<bool> (strata.cli.metavars)
