"""`strata ring plan`: the partition a ring would use for a model, and its predicted speed.

Registered on the `strata ring` sub-app (strata.cli.ring imports this module). Members come
from a running daemon (--connect), from JSON files (--members) or are emulated (--node
NAME:GiB[:GB/s]); with none of these, this host alone. The use case is
strata.commands.ring.plan, the search strata.ring.plan.partition, the printer
strata.views.ring_plan.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from strata.cli import DbOption, err, out
from strata.cli.helptext import reflowed
from strata.cli.output import FormatOption, JsonOption, output_format
from strata.cli.ring import SECRET_HELP, ring_app, use_secret
from strata.fit.plan import DEFAULT_CTX
from strata.views.output import emit

MEMBERS = "Members"


@ring_app.command("plan")
@reflowed
def plan(
    model: Annotated[str, typer.Argument(
        metavar="MODEL", help="file.gguf, a Hugging Face dir or synthetic:<preset>@<quant>. "
        "Only its metadata is read here (with --connect, each member loads one layer to "
        "time it).")],
    node: Annotated[list[str] | None, typer.Option(
        "--node", metavar="NAME:GIB[:GB/S]", rich_help_panel=MEMBERS,
        help="An emulated member: GiB of memory and, optionally, GB/s of memory "
        "bandwidth. Repeat it, one per member.", show_default=False)] = None,
    members_file: Annotated[list[Path] | None, typer.Option(
        "--members", metavar="FILE", rich_help_panel=MEMBERS,
        help="JSON: a list of members, or the output of `strata ring status -o json`; "
        "\"links\" in it are used too.", show_default=False)] = None,
    connect: Annotated[str | None, typer.Option(
        "--connect", metavar="HOST:PORT", rich_help_panel=MEMBERS,
        help="Plan on the live members of this daemon's ring, each with its own "
        "measured time per layer of MODEL.",
        show_default=False)] = None,
    secret_file: Annotated[Path | None, typer.Option(
        "--secret-file", metavar="PATH", rich_help_panel=MEMBERS, help=SECRET_HELP,
        show_default=False)] = None,
    mem_cap: Annotated[float | None, typer.Option(
        "--mem-cap", metavar="GIB", rich_help_panel=MEMBERS,
        help="Cap every member at this many GiB (emulates small nodes).",
        show_default=False)] = None,
    link: Annotated[str | None, typer.Option(
        "--link", metavar="RTT_MS:MB/S", rich_help_panel=MEMBERS,
        help="Round trip and bandwidth of each link not measured; gigabit Ethernet "
        "is about 0.3:110.", show_default=False)] = None,
    ctx: Annotated[int | None, typer.Option(
        "--ctx", "-c", help=f"Context per sequence, in tokens (default {DEFAULT_CTX}).",
        show_default=False)] = None,
    ops: Annotated[str, typer.Option(
        "--ops", help="How the members' stages compute (strata ring serve --ops): lab holds "
        "the weights as stored in the file; torch makes float32 copies.")] = "lab",
    kv_type: Annotated[str, typer.Option(
        "--kv-type", metavar="TYPE", help="The stages' K/V cache (ring run "
        "--kv-type): f16, 2 bytes an element; f32, 4; q8_0, 34 per 32.")] = "f16",
    fmt: FormatOption = None,
    json_out: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Which members would hold which layers of MODEL, and how fast it would decode.

    Each member's share (its layers' weights, their KV cache at --ctx, the embedding on the
    first and the head on the last) fits in 0.9 of its memory; the plan uses as few
    members as the model needs, choosing order and sizes for the least predicted time per
    token: each member's layers x its measured time per layer (with --connect: every member
    times one layer of MODEL), else bytes it reads per token ÷ its bandwidth x η, plus each
    link's RTT/2 + bytes ÷ MB/s. Members: --connect, --members, --node, else this host
    alone.

    [bold]Examples[/bold]
      strata ring plan synthetic:llama-3.1-8b@q4_0 --node a:16:60 --node b:8:20
      strata ring plan model.gguf --connect 192.168.1.10:7473 -o json
      strata ring plan synthetic:tiny --mem-cap 0.001 --link 0.2:1000
    """
    from strata.commands.ring import PlanOptions
    from strata.commands.ring import plan as ring_plan
    from strata.views.ring_plan import MD_FIELDS, print_plan

    chosen = output_format(fmt, json_out)
    use_secret(secret_file)
    result = ring_plan(PlanOptions(model, node or [], members_file or [], connect=connect,
                                   mem_cap=mem_cap, link=link, ctx=ctx, ops=ops, db=db,
                                   kv_type=kv_type), err)
    emit(out, chosen, result.records(), document=result.to_json(), md_columns=MD_FIELDS,
         table=lambda: print_plan(result, out))
