"""`strata fleet …`: the same measurement on every member of a ring, gathered in one DB.

The logic lives in strata.ring.control.fleet; this file parses, validates the bench flags here
(before any member is asked) and prints through bench's own views.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from strata.cli import DbOption, app, check_positive, err, open_store, out
from strata.cli.helptext import reflowed
from strata.cli.output import FormatOption, JsonOption, output_format
from strata.cli.ring import SECRET_HELP, use_secret
from strata.errors import InputError
from strata.ring.control.wire import DEFAULT_PORT
from strata.views.output import emit

fleet_app = typer.Typer(
    name="fleet", no_args_is_help=True, rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Every ring member measured on its own hardware, the results gathered in this "
    "host's database.")
app.add_typer(fleet_app)

MEMBERS = "Members"
MD_COLUMNS = ("node", "hostname", "model_filename", "backend", "test", "avg_ts", "stddev_ts",
              "eta", "bound", "n", "error")


@fleet_app.command("bench", context_settings={"ignore_unknown_options": True})
@reflowed
def bench(
    model: Annotated[str, typer.Argument(
        metavar="MODEL", help="As `strata bench` takes it, resolved on each member: "
        "synthetic:<preset>, or a file in the directories it serves (its `ring serve "
        "--models`).")],
    bench_flags: Annotated[list[str] | None, typer.Argument(
        metavar="BENCH-FLAG", help="Any `strata bench` flag (-p, -n, -B, -r, -t, "
        "…), passed to every member as given.", show_default=False)] = None,
    connect: Annotated[list[str] | None, typer.Option(
        "--connect", metavar="HOST:PORT", rich_help_panel=MEMBERS,
        help="A ring daemon: it and its peers are the members (repeatable; default: "
        f"127.0.0.1:{DEFAULT_PORT} unless --peers is given).", show_default=False)] = None,
    peers: Annotated[str | None, typer.Option(
        "--peers", metavar="ADDRS", rich_help_panel=MEMBERS,
        help="host:port,... of daemons to ask directly, besides --connect's ring.",
        show_default=False)] = None,
    parallel: Annotated[bool, typer.Option(
        "--parallel", rich_help_panel=MEMBERS,
        help="Every member at once (faster; only when no two share a machine, memory "
        "bus or network).")] = False,
    timeout: Annotated[float, typer.Option(
        "--timeout", metavar="SECONDS", help="Each member's bench is stopped past this "
        "(what finished is kept).")] = 3600.0,
    secret_file: Annotated[Path | None, typer.Option(
        "--secret-file", metavar="PATH", rich_help_panel=MEMBERS, help=SECRET_HELP,
        show_default=False)] = None,
    fmt: FormatOption = None,
    json_out: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Run `strata bench` on every ring member, each on its own hardware, and store every
    result here with that member's host fingerprint, so that `strata compare`, `history`
    and `report` cover the whole fleet.

    Members are asked one after another by default: benchmarks running at the same time
    disturb each other when members share a machine, memory bus or network link. Each
    member runs the bench with its own database (its roofline, its history) and sends
    back its results and host profile. A member that is down, lacks the model or fails is
    one line saying why, and the others still run.

    Exit status: 0 results from at least one member, 2 bad flags or nothing ran on any
    member.

    [bold]Examples[/bold]
      strata fleet bench synthetic:tiny -p 128 -n 32 --connect 192.168.1.10:7473
      strata fleet bench model.gguf -B llamacpp -t 4 --peers a:7473,b:7473 -o md
      strata compare host:0de260d8 host:9a1f3c2b  [dim]# then: two members[/dim]
    """
    from strata.ring.control.fleet import find_targets, gather
    from strata.ring.control.wire import parse_peers

    chosen = output_format(fmt, json_out)
    check_positive("--timeout", timeout)
    use_secret(secret_file)
    args = [model, *(bench_flags or [])]
    check_bench_flags(args)  # bad flags fail here, in one line, before any member is asked
    peer_list = [f"{h}:{p}" for h, p in parse_peers(peers)]
    connect = connect or ([] if peer_list else [f"127.0.0.1:{DEFAULT_PORT}"])
    targets = find_targets(connect, peer_list, timeout_s=10.0)
    conn = open_store(db)
    outcomes = gather(conn, targets, args, timeout, parallel, _say)
    show(outcomes, chosen)
    if not any(o.results for o in outcomes):
        raise InputError(f"nothing ran on any of the {len(outcomes)} member(s) "
                         "(reasons above)")


def check_bench_flags(args: list[str]) -> None:
    """Parse the flags as `strata bench` does and validate them into its config, without
    resolving the model (it only has to exist on the members)."""
    from typer.exceptions import TyperException

    from strata.cli.bench import refuse_llama_bench_only
    from strata.commands.bench_options import BenchFlags, build_config
    from strata.ring.control.fleet import MEMBER_FLAGS

    for a in args:
        if a.split("=", 1)[0] in MEMBER_FLAGS:
            raise InputError(f"{a}: not a fleet bench flag (each member uses its own "
                             "results DB)")
    command = typer.main.get_command(app).commands["bench"]  # type: ignore[attr-defined]
    try:
        ctx = command.make_context("bench", list(args))
    except TyperException as exc:  # typer's click: an unknown flag, a missing value
        raise InputError(f"bench flags: {exc.format_message()} (see 'strata bench "
                         "--help')") from None
    params = dict(ctx.params)
    refuse_llama_bench_only(params)
    for own in ("fmt", "json_out", "list_presets", "progress", "db"):
        params.pop(own, None)  # the member sets these; fleet's -o/--json/--db are its own
    build_config(BenchFlags(**params))


def _say(line: str) -> None:
    err.print(escape(line), highlight=False, soft_wrap=True)


def show(outcomes: list[Any], fmt: str) -> None:
    from strata.ring.control.fleet import member_records, result_records

    records = result_records(outcomes)
    document = {"members": member_records(outcomes),
                "results": [r for r in records if r.get("model_filename")]}
    emit(out, fmt, records, document=document, md_columns=MD_COLUMNS,
         table=lambda: _tables(outcomes))


def _tables(outcomes: list[Any]) -> None:
    """bench's own table of every member's results, led by a node column; then who ran
    what, and why a member has nothing."""
    from strata.bench.records import record
    from strata.views.bench import bench_table, notes_lines

    rows = [(o.node, record(r)) for o in outcomes for r in o.results]
    if rows:
        out.print(with_lead("node", [n for n, _ in rows],
                            bench_table([r for _, r in rows], title="strata fleet bench")))
    for o in outcomes:  # each member's notes under its name: hosts differ in what they see
        for line in notes_lines([r for n, r in rows if n == o.node]):
            err.print(f"[dim]note[/dim] {escape(o.node)}: {escape(line)}", highlight=False)
    t = Table(title="members", title_justify="left")
    for col in ("node", "address", "host", "fingerprint", "runs", "results", "status"):
        t.add_column(col, justify="right" if col in ("results",) else "left")
    for o in outcomes:
        status = o.error or "ok"
        t.add_row(o.node, o.addr, o.hostname or "-", o.fingerprint or "-",
                  ",".join(map(str, o.run_ids)) or "-", str(len(o.results)),
                  escape(status if o.results or not o.error else f"nothing ran: {status}"))
    out.print(t)
    for o in outcomes:
        for why in o.skipped:
            err.print(f"[yellow]skipped[/yellow] {escape(o.node)}: {escape(why)}",
                      highlight=False)


def with_lead(header: str, cells: list[str], table: Table) -> Table:
    """`table` with a first column (rich tables cannot insert one): same title, columns,
    alignment and cells."""
    lead = Table(title=table.title, title_justify=table.title_justify)
    lead.add_column(header)
    for col in table.columns:
        lead.add_column(col.header, justify=col.justify, style=col.style)
    columns = [list(col.cells) for col in table.columns]
    for i, cell in enumerate(cells):
        lead.add_row(escape(cell), *(c[i] for c in columns))
    return lead
