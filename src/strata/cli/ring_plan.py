"""`strata ring plan`: the partition a ring would use for a model, and its predicted speed.

Registered on the `strata ring` sub-app (strata.cli.ring imports this module). Members come
from a running daemon (--connect), from JSON files (--members) or are emulated (--node
NAME:GiB[:GB/s]); with none of these, this host alone. The logic is strata.ring.plan.partition.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from strata.cli import DbOption, check_positive, err, out
from strata.cli.helptext import reflowed
from strata.cli.output import FormatOption, JsonOption, emit, output_format, read_store
from strata.cli.ring import ring_app
from strata.errors import InputError
from strata.fit.plan import DEFAULT_CTX
from strata.ring.plan.links import Link
from strata.ring.plan.members import GiB, Member
from strata.ring.plan.types import LayerTime

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
        help="Plan on the live members of the ring this daemon belongs to, with each "
        "one's measured time per layer of MODEL.",
        show_default=False)] = None,
    mem_cap: Annotated[float | None, typer.Option(
        "--mem-cap", metavar="GIB", rich_help_panel=MEMBERS,
        help="Cap every member at this many GiB (emulates small nodes).",
        show_default=False)] = None,
    link: Annotated[str | None, typer.Option(
        "--link", metavar="RTT_MS:MB/S", rich_help_panel=MEMBERS,
        help="Round trip and bandwidth of every link not measured (e.g. gigabit "
        "Ethernet: 0.3:110).", show_default=False)] = None,
    ctx: Annotated[int | None, typer.Option(
        "--ctx", "-c", help=f"Context per sequence, in tokens (default {DEFAULT_CTX}).",
        show_default=False)] = None,
    ops: Annotated[str, typer.Option(
        "--ops", help="How the members' stages compute (strata ring serve --ops): lab holds "
        "the weights as stored in the file, torch dequantises them to float32.")] = "lab",
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
    from strata.ring.plan.partition import HELD_DTYPE, plan_ring
    from strata.views.ring_plan import MD_FIELDS, print_plan

    chosen = output_format(fmt, json_out)
    if ops not in HELD_DTYPE:
        raise InputError(f"--ops {ops}: choose one of {', '.join(HELD_DTYPE)}")
    if mem_cap is not None:
        check_positive("--mem-cap", mem_cap)
    given = _given_link(link)
    members, measured = _members(node or [], members_file or [], connect, db)
    if mem_cap is not None:
        from strata.ring.plan.members import capped

        members = [capped(m, int(mem_cap * GiB)) for m in members]
    links = _all_links(members, measured, given)
    times, missing, why = _daemon_times(connect, model) if connect is not None else \
        ({}, {}, "")
    result = plan_ring(model, members, DEFAULT_CTX if ctx is None else ctx, links,
                       weights_dtype=HELD_DTYPE[ops], measured=times)
    if connect is not None:
        from strata.ring.control.layer_time import estimate_notes

        result.notes += estimate_notes(times, missing, [s.member for s in result.stages],
                                       why)
    emit(out, chosen, result.records(), document=result.to_json(), md_columns=MD_FIELDS,
         table=lambda: print_plan(result, out))


def _given_link(text: str | None) -> Link | None:
    from strata.ring.plan.links import parse_link

    return parse_link(text) if text is not None else None


def _members(nodes: list[str], files: list[Path], connect: str | None,
             db: Path | None) -> tuple[list[Member], dict[tuple[str, str], Link]]:
    from strata.ring.plan import links as ring_links
    from strata.ring.plan import members as ring_members

    out_members: list[Member] = [ring_members.emulated(n) for n in nodes]
    measured: dict[tuple[str, str], Link] = {}
    docs = [(_read_json(f), str(f)) for f in files]
    if connect is not None:
        docs.append((_daemon_status(connect), f"--connect {connect}"))
    for doc, where in docs:
        out_members += ring_members.from_document(doc, where)
        measured.update(ring_links.from_document(doc, where))
    if not out_members:  # this host alone
        with err.status("probing host…"):
            out_members = [Member.local(conn=read_store(db))]
    return out_members, measured


def _all_links(members: list[Member], measured: dict[tuple[str, str], Link],
               given: Link | None) -> dict[tuple[str, str], Link]:
    """Measured links, and --link for every pair that has none."""
    links = dict(measured)
    if given is not None:
        for a in members:
            for b in members:
                if a.id != b.id and (a.id, b.id) not in links and (b.id, a.id) not in links:
                    links[(a.id, b.id)] = given
    return links


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"--members {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"--members {path}: not JSON ({exc})") from None


def _daemon_times(connect: str, model: str) -> tuple[dict[str, LayerTime], dict[str, str],
                                                    str]:
    """Every live member's timed decoder layer of `model`, gathered by the daemon (each
    member times its own, in parallel); a daemon that cannot (an older one) leaves every
    member on the bandwidth x η estimate, and the notes say why."""
    from strata.ring.control.layer_time import GATHER_TIMEOUT_S
    from strata.ring.control.wire import PeerError, parse_addr, request

    try:
        with err.status("timing a decoder layer on each member…"):
            reply = request(*parse_addr(connect), {"op": "layer_times", "model": model},
                            timeout_s=GATHER_TIMEOUT_S + 5.0, connect_timeout_s=5.0)
        times = {str(k): LayerTime.from_dict(v) for k, v in dict(reply["times"]).items()}
        missing = {str(k): str(v) for k, v in dict(reply.get("missing") or {}).items()}
        return times, missing, "no layer time"
    except (PeerError, KeyError, ValueError, TypeError) as exc:
        return {}, {}, f"no layer times from --connect {connect} ({exc})"


def _daemon_status(connect: str) -> object:
    from strata.ring.control.wire import parse_addr, request

    reply = request(*parse_addr(connect), {"op": "status"}, timeout_s=5.0,
                    connect_timeout_s=5.0)
    reply.pop("ok", None)
    return reply
