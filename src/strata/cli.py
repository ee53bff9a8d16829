"""The `strata` command: one thin command per user question (DESIGN §1, §6).

Logic lives in the packages; this file parses flags, calls them, prints, and maps errors
to exit codes: 0 success, 1 failure of the thing measured, 2 usage or input error.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from typer.exceptions import Abort, TyperException

from strata import __version__
from strata.errors import InputError, StrataError

app = typer.Typer(
    name="strata",
    help="What will run on this machine, how fast, and why: measured, not guessed.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode="rich",
)
out = Console()
err = Console(stderr=True)

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
          = False) -> None:
    """strata profiles local-AI hardware: probe, measure, bench, explain."""


def _open_store(db: Path | None):  # -> sqlite3.Connection
    from strata.paths import default_db_path
    from strata.store import open_db

    return open_db(db or default_db_path())


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise InputError(f"{name} must be > 0 (got {value})")


@app.command()
def probe(
    measure: Annotated[bool, typer.Option("--measure", help="Also measure memory bandwidth and "
                                          "matmul FLOP/s per dtype: this host's roofline "
                                          "(about 10-30 s on a small CPU).")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the profile (and roofline) as "
                                           "JSON on stdout instead of tables.")] = False,
    watch: Annotated[float | None, typer.Option("--watch", metavar="SECONDS",
                                                help="Sample telemetry (clocks, temperatures, "
                                                "power, throttling) live for SECONDS, then "
                                                "summarise.")] = None,
    interval_ms: Annotated[int, typer.Option("--interval", metavar="MS",
                                             help="Telemetry sampling interval for --watch.")]
    = 250,
    smoke: Annotated[bool, typer.Option("--smoke/--no-smoke", help="Run the per-device smoke "
                                        "test (tiny ops in each dtype, in a subprocess).")]
    = True,
    smoke_timeout: Annotated[float, typer.Option("--smoke-timeout", metavar="SECONDS",
                                                 help="Kill a smoke test that runs longer.")]
    = 90.0,
    db: DbOption = None,
) -> None:
    """What this machine is, whether its stack can drive each device, and (--measure) its roofline.

    The probe names CPU features, GPUs (physical arch), the torch/llama.cpp/Triton stack,
    and a support verdict per device from two checks: arch rules and a smoke test.
    --measure stores this host's roofline for every later command.

    [bold]Examples[/bold]
      strata probe               [dim]# hardware, software, support verdicts[/dim]
      strata probe --measure     [dim]# + bandwidth and FLOP/s (the roofline)[/dim]
      strata probe --watch 30    [dim]# live telemetry, throttling verdict[/dim]
      strata probe --json > host.json
    """
    _positive("--smoke-timeout", smoke_timeout)
    if watch is not None:
        _positive("--watch", watch)
    if not 10 <= interval_ms <= 10_000:
        raise InputError(f"--interval must be between 10 and 10000 ms (got {interval_ms})")
    conn = _open_store(db)  # fail on a bad --db before spending time probing
    from strata.commands.probe import run_probe

    result = run_probe(conn, measure=measure, smoke=smoke, smoke_timeout_s=smoke_timeout,
                       console=err)
    if not json_out:
        result.render(out)
    if watch is not None:
        from strata.commands.probe import run_watch

        result.telemetry = run_watch(conn, result.fingerprint, watch, interval_ms / 1000, err)
    if json_out:
        print(json.dumps(result.to_dict(), indent=2, default=str))


@app.command()
def hosts(
    json_out: Annotated[bool, typer.Option("--json", help="Print as JSON.")] = False,
    db: DbOption = None,
) -> None:
    """List the hosts in the results database, one per hardware + software fingerprint."""
    from strata.store.hosts import list_hosts
    from strata.views.hosts import hosts_table

    rows = list_hosts(_open_store(db))
    if json_out:
        print(json.dumps([r.__dict__ for r in rows], indent=2))
    elif not rows:
        err.print("no hosts stored yet: run `strata probe` (or `strata probe --measure`)")
    else:
        out.print(hosts_table(rows))


def main() -> None:
    """Entry point: every usage/input error becomes one line on stderr and exit code 2."""
    try:
        code = app(standalone_mode=False)
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
    err.print(f"[bold red]error:[/bold red] {message}", highlight=False, markup=True,
              soft_wrap=True)
    sys.exit(code)


if __name__ == "__main__":
    main()
