"""`strata probe` and `strata hosts`: what this machine is, and the hosts in the DB."""

from __future__ import annotations

from typing import Annotated

import typer

from strata.cli import DbOption, app, check_positive, err, open_store, out
from strata.cli.helptext import reflowed
from strata.cli.output import (
    TABLE,
    FormatOption,
    JsonOption,
    ProgressOption,
    no_store,
    output_format,
    read_store,
)
from strata.errors import InputError, StrataError
from strata.views.console import set_progress
from strata.views.output import emit


@app.command()
@reflowed
def probe(
    measure: Annotated[bool, typer.Option("--measure", help="Also measure memory bandwidth and "
                                          "matmul FLOP/s per dtype: this host's roofline "
                                          "(about 10-30 s on a small CPU).")] = False,
    fmt: FormatOption = None,
    json_out: JsonOption = False,
    watch: Annotated[float | None, typer.Option("--watch", metavar="SECONDS",
                                                help="Sample telemetry (clocks, temperatures, "
                                                "power, throttling) live for SECONDS, then "
                                                "summarise.")] = None,
    interval_ms: Annotated[int, typer.Option("--interval", metavar="MS",
                                             help="Telemetry sampling interval for --watch.")]
    = 250,
    smoke: Annotated[bool, typer.Option("--smoke/--no-smoke", help="Run the per-device smoke "
                                        "test: tiny ops in each dtype, in a subprocess.")]
    = True,
    smoke_timeout: Annotated[float, typer.Option(
        "--smoke-timeout", metavar="SECONDS",
        help="Kill a smoke test that runs longer than this.")]
    = 90.0,
    allow_busy: Annotated[bool, typer.Option("--allow-busy", help="With --measure: store the "
                                             "roofline even when other processes kept the "
                                             "host busy in every attempt (its peaks are then "
                                             "low; it is stored flagged as such).")] = False,
    fresh: Annotated[bool, typer.Option("--fresh", help="With --measure: store this "
                                        "measurement as is. By default a figure an earlier "
                                        "run of this host measured higher (and stable) is "
                                        "kept: peaks are maxima. Use after a BIOS, power or "
                                        "cooling change.")] = False,
    progress: ProgressOption = None,
    db: DbOption = None,
) -> None:
    """What this machine is, whether its stack can drive each device, and (--measure) its roofline.

    The probe names CPU features, GPUs (physical arch), the torch/llama.cpp/Triton stack,
    and a support verdict per device from two checks: arch rules and a smoke test.
    --measure stores this host's roofline for every later command: each figure is the best
    of several trials, and of earlier runs of this host (--fresh: of this run only); on a
    busy host it measures again, and refuses to store peaks known to be low (exit 1) unless
    --allow-busy.

    [bold]Examples[/bold]
      strata probe               [dim]# hardware, software, support verdicts[/dim]
      strata probe --measure     [dim]# + bandwidth and FLOP/s (the roofline)[/dim]
      strata probe --watch 30    [dim]# live telemetry, throttling verdict[/dim]
      strata probe -o json > host.json   [dim]# everything, as JSON[/dim]
      strata probe --no-smoke -o csv     [dim]# one row per device[/dim]
    """
    fmt = output_format(fmt, json_out)
    if progress is not None:
        set_progress(progress)
    check_positive("--smoke-timeout", smoke_timeout)
    if watch is not None:
        check_positive("--watch", watch)
    if not 10 <= interval_ms <= 10_000:
        raise InputError(f"--interval must be between 10 and 10000 ms (got {interval_ms})")
    if fresh and not measure:
        raise InputError("--fresh only applies to a measurement: add --measure")
    conn = open_store(db)  # fail on a bad --db before spending time probing
    from strata.commands.probe import probe_records, run_probe

    result = run_probe(conn, measure=measure, smoke=smoke, smoke_timeout_s=smoke_timeout,
                       console=err, allow_busy=allow_busy,
                       fresh=fresh)
    if fmt == TABLE:
        result.render(out)
    if watch is not None:
        from strata.commands.probe import run_watch

        result.telemetry = run_watch(conn, result.fingerprint, watch, interval_ms / 1000, err)
    if fmt != TABLE:
        emit(out, fmt, probe_records(result), document=result.to_dict())
    if result.refused:
        raise StrataError(result.refused)  # printed above, not stored: exit 1


@app.command()
@reflowed
def hosts(
    fmt: FormatOption = None,
    json_out: JsonOption = False,
    db: DbOption = None,
) -> None:
    """List the hosts in the results database, one per hardware + software fingerprint.

    Reads the database only: nothing is created or written.

    [bold]Examples[/bold]
      strata hosts
      strata hosts -o json
      strata hosts --db ~/lab/strata.db -o csv
    """
    from strata.store.hosts import host_records, list_hosts
    from strata.views.hosts import hosts_table

    fmt = output_format(fmt, json_out)
    conn = read_store(db)
    rows = list_hosts(conn) if conn is not None else []
    if not rows:
        where = no_store(db) if conn is None else "no hosts stored yet"
        err.print(f"{where}; run `strata probe` (or `strata probe --measure`)", markup=False)
    emit(out, fmt, host_records(rows), table=lambda: rows and out.print(hosts_table(rows)))

