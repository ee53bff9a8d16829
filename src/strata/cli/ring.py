"""`strata ring …`: machines that find each other and run one model across them.

serve starts a node daemon; status and run talk to a daemon over the control protocol
(strata.ring.control.wire). The use cases are strata.commands.ring, the printers
strata.views.ring; this file parses and prints.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from strata.cli import app, err, out
from strata.cli.helptext import reflowed
from strata.cli.output import FormatOption, JsonOption, output_format
from strata.ring.control.wire import DEFAULT_PORT
from strata.views.output import emit

ring_app = typer.Typer(
    name="ring", no_args_is_help=True, rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    help="A ring of machines: nodes find each other (mDNS or --peers), split a model by "
    "what each can hold, and generate with output identical to one machine's.")
app.add_typer(ring_app)

ConnectOption = Annotated[str, typer.Option(
    "--connect", metavar="HOST:PORT", help="The daemon to ask, on any member of "
    "the ring.")]
TimeoutOption = Annotated[float, typer.Option(
    "--timeout", metavar="SECONDS", help="A peer silent this long is dropped.")]


@ring_app.command("serve")
@reflowed
def serve(
    name: Annotated[str | None, typer.Option(
        "--name", help="This node's id, unique in the ring (the lowest id leads); default: "
        "the host name (plus -PORT off port 7473).", show_default=False)]
    = None,
    port: Annotated[int, typer.Option("--port", help="Control port (TCP).")] = DEFAULT_PORT,
    peers: Annotated[str | None, typer.Option(
        "--peers", metavar="ADDRS", help="host:port,... of nodes to join where "
        "multicast does not reach; one live member is enough.", show_default=False)] = None,
    device: Annotated[str, typer.Option("--device", help="Where this node's layers run "
                                        "(cpu, cuda:0, ...).")] = "cpu",
    ops: Annotated[str, typer.Option(
        "--ops", help="How this node's layers compute: lab (the kernel lab's verified kernels "
        "on the GGUF's blocks as stored) or torch (the weights dequantised to float32, "
        "4 bytes each).")] = "lab",
    mem_cap: Annotated[float | None, typer.Option(
        "--mem-cap", metavar="GIB", help="Memory this node may use for the model, in GiB "
        "(default: what is available).", show_default=False)] = None,
    threads: Annotated[str | None, typer.Option(
        "-t", "--threads", help="Threads this node's kernels use (default: OMP_NUM_THREADS, "
        "else the physical cores); members on one machine split its cores.",
        show_default=False)] = None,
    host: Annotated[str, typer.Option(
        "--host", metavar="ADDR", help="Address to listen on and advertise (default: every "
        "interface).")] = "0.0.0.0",
    mdns: Annotated[bool, typer.Option("--mdns/--no-mdns", help="Advertise and browse "
                                       "_strata-ring._tcp by multicast DNS.")] = True,
    timeout: TimeoutOption = 3.0,
    db: Annotated[Path | None, typer.Option(
        "--db", help="Results database (default: $STRATA_HOME/"
        "strata.db): this host's measured roofline and η.", show_default=False)] = None,
    # Test hooks, hidden: pretend another strata version; crash mid-generation.
    version_as: Annotated[str | None, typer.Option("--version-as", hidden=True)] = None,
    die_at: Annotated[int | None, typer.Option("--die-at", hidden=True)] = None,
) -> None:
    """Run a ring node until interrupted: it joins the members it finds and serves its share.

    Peers come from mDNS, --peers and what the members already know. Each member is pinged
    every timeout/6 s over its control connection: a closed connection drops it at once, a
    silent one after --timeout (an mDNS record is never taken as proof of life). A peer
    running another strata version is refused, with the reason, on both sides. Events
    are logged to stderr, one line each.

    [bold]Examples[/bold]
      strata ring serve
      strata ring serve --name b --port 7474 --peers 192.168.1.10:7473
      strata ring serve --device cuda:0 --mem-cap 20
      strata ring serve --ops torch
      strata ring serve -t 4 --name a --port 7473
      strata ring serve -t 4 --name b --port 7474   (with a: one 8-core host)
    """
    from strata.commands.ring import ServeOptions
    from strata.commands.ring import serve as serve_node
    from strata.views.ring import serve_line

    def say(line: str) -> None:
        err.print(line, highlight=False, markup=False, soft_wrap=True)

    serve_node(ServeOptions(name=name, port=port, peers=peers, device=device, ops=ops,
                            mem_cap=mem_cap, threads=threads, host=host, mdns=mdns,
                            timeout=timeout, db=db,
                            version_as=version_as, die_at=die_at),
               log=say, started=lambda node: say(serve_line(node)))
    # Stopped and said bye; a daemon thread may still hold gloo objects (an idle stage's
    # group), which the interpreter's teardown would free in the garbage collector, where
    # gloo aborts (exit -6 seen in CI). Nothing is left to flush but the streams: leave
    # without the teardown, as strata.train's ranks do.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@ring_app.command("status")
@reflowed
def status(
    connect: ConnectOption = f"127.0.0.1:{DEFAULT_PORT}",
    timeout: Annotated[float, typer.Option("--timeout", metavar="SECONDS",
                                           help="Seconds to wait for the daemon's answer.")]
    = 5.0,
    fmt: FormatOption = None,
    json_out: JsonOption = False,
) -> None:
    """The ring as one daemon sees it: members, their device and free memory, the links.

    Lists this node and every peer it knows, live or not (unreachable, refused with the
    reason, lost after the heartbeat timeout), with the control link's round-trip time.

    [bold]Examples[/bold]
      strata ring status
      strata ring status --connect 192.168.1.10:7473 --json
    """
    from strata.commands.ring import status as ring_status
    from strata.views.ring import STATUS_COLUMNS, links_table, status_records, status_table

    chosen = output_format(fmt, json_out)
    reply = ring_status(connect, timeout)
    records = status_records(reply)
    def tables() -> None:
        out.print(status_table(reply, records))
        links = links_table(reply)
        if links is not None:
            out.print(links)

    emit(out, chosen, records, document=reply, md_columns=STATUS_COLUMNS, table=tables)


@ring_app.command("run")
@reflowed
def run(
    model: Annotated[str, typer.Argument(
        metavar="MODEL", help="file.gguf or synthetic:<preset>[@quant]: the same file on "
        "every member (a member whose copy differs refuses, saying so).")],
    prompt: Annotated[str, typer.Option("-p", "--prompt", help="The prompt text.")],
    n_predict: Annotated[str, typer.Option("-n", "--n-predict",
                                           help="Tokens to generate.")] = "32",
    seed: Annotated[int | None, typer.Option(
        "--seed", help="Seed of the sampling (at --temperature above 0).",
        show_default=False)] = None,
    temperature: Annotated[float, typer.Option(
        "--temperature", "--temp", help="Above 0 (with --seed): sample at this "
        "temperature.")] = 0.0,
    chat: Annotated[bool, typer.Option(
        "--chat", help="Send the prompt as one user turn formatted by the GGUF's chat "
        "template (tokenizer.chat_template, through llama.cpp), the reply's start "
        "included, as llama-cli's conversation mode.")] = False,
    connect: ConnectOption = f"127.0.0.1:{DEFAULT_PORT}",
    timeout: Annotated[float, typer.Option(
        "--timeout", metavar="SECONDS", help="Give up after this long without a word from "
        "the daemon (it reports progress every second).")] = 30.0,
    fmt: FormatOption = None,
    json_out: JsonOption = False,
) -> None:
    """Generate across the ring: the leader plans, each member runs its layers.

    The daemon at --connect passes the request to the leader (the lowest id), which plans
    on the live members (see `strata ring plan`), opens a new epoch and drives the
    generation from the member holding the first layers. If a member is lost mid-way, the
    leader plans again over the others and the new ring replays the prompt and the tokens
    so far; the output equals an uninterrupted run's, or the error says what is missing.

    [bold]Examples[/bold]
      strata ring run synthetic:tiny-deep -p "Hello" -n 16
      strata ring run model.gguf -p "Once upon a time" -n 64 --seed 1 --temp 0.8
      strata ring run qwen3-0.6b-q8_0.gguf -p "Why is the sky blue?" -n 128 --chat
    """
    from strata.commands.ring import run as ring_run
    from strata.views.ring import RUN_COLUMNS, run_record, run_table

    chosen = output_format(fmt, json_out)
    reply = ring_run(model, prompt, n_predict, seed, temperature, connect, timeout, chat)
    emit(out, chosen, [run_record(reply)], document=reply, md_columns=RUN_COLUMNS,
         table=lambda: run_table(reply, out))


# `strata ring plan` lives in its own module (helper D's); importing it registers it here.
from strata.cli import ring_plan  # noqa: E402, F401
