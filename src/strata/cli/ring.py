"""`strata ring …`: machines that find each other and run one model across them.

serve starts a node daemon; status and run talk to a daemon over the control protocol
(strata.ring.control.wire). The logic lives in strata.ring; this file parses and prints.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from strata.cli import app, check_positive, err, out
from strata.cli.helptext import reflowed
from strata.cli.output import FormatOption, JsonOption, emit, output_format, read_store
from strata.errors import InputError
from strata.ring.control.wire import DEFAULT_PORT

ring_app = typer.Typer(
    name="ring", no_args_is_help=True, rich_markup_mode="rich",
    context_settings={"help_option_names": ["-h", "--help"]},
    help="A ring of machines: nodes find each other (mDNS or --peers), split a model by "
    "what each can hold, and generate with output identical to one machine's.")
app.add_typer(ring_app)

GIB = 1024**3
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
    """
    from strata.ring.control.node import Node, NodeConfig
    from strata.ring.plan.members import Member

    check_positive("--timeout", timeout)
    from strata.engine.ops import names as ops_names

    if ops not in ops_names():
        raise InputError(f"--ops {ops}: choose one of {', '.join(ops_names())}")
    if mem_cap is not None:
        check_positive("--mem-cap", mem_cap)
    from strata.ring.control.wire import bind, parse_peers

    config = NodeConfig(name=name or _default_name(port), host=host, port=port,
                        peers=parse_peers(peers), device=device, ops=ops, mdns=mdns,
                        mem_cap_bytes=None if mem_cap is None else int(mem_cap * GIB),
                        heartbeat_s=timeout / 6, timeout_s=timeout, db=db)
    # The port first: one that is in use fails in one line before the host is probed.
    sock = bind(host, port)
    if version_as:
        config.version = version_as
    config.die_at = die_at
    member = Member.local(device, name=config.name, host=_advertised(host), port=port,
                          mem_cap_bytes=config.mem_cap_bytes, conn=read_store(db))
    node = Node(config, member, log=lambda line: err.print(line, highlight=False,
                                                           markup=False, soft_wrap=True))
    # Before start: registering with mDNS takes a second or two, and a SIGTERM meanwhile
    # must still end in a clean stop.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: node.stopped.set())
    node.start(sock)
    err.print(f"ring node {member.id} on {member.host}:{config.port} ({device}, {ops} ops, "
              f"{_gib(member.available_bytes)} available); mDNS "
              f"{'on' if node.mdns and not node.mdns.reason else 'off'}", highlight=False,
              markup=False, soft_wrap=True)
    try:
        while not node.stopped.wait(0.5):
            pass
    finally:
        node.stopped.clear()  # stop() says bye only once; it sets the event again
        node.stop()
    # Stopped and said bye; a daemon thread may still hold gloo objects (an idle stage's
    # group), which the interpreter's teardown would free in the garbage collector, where
    # gloo aborts (exit -6 seen in CI). Nothing is left to flush but the streams: leave
    # without the teardown, as strata.train's ranks do.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _default_name(port: int) -> str:
    host = socket.gethostname().split(".")[0] or "node"
    return host if port == DEFAULT_PORT else f"{host}-{port}"


def _advertised(host: str) -> str:
    from strata.ring.control.discovery import _primary_address

    return _primary_address() if host in ("", "0.0.0.0") else host


def _gib(n: Any) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


STATUS_COLUMNS = ("id", "addr", "state", "device", "available_bytes", "mem_cap_bytes",
                  "bandwidth_gbps", "rtt_ms", "epoch", "leader", "reason")


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
    from strata.ring.control.wire import parse_addr, request
    from strata.views.ring import links_table, status_records, status_table

    chosen = output_format(fmt, json_out)
    check_positive("--timeout", timeout)
    reply = request(*parse_addr(connect), {"op": "status"}, timeout_s=timeout,
                    connect_timeout_s=timeout)
    reply.pop("ok", None)
    records = status_records(reply)
    def tables() -> None:
        out.print(status_table(reply, records))
        links = links_table(reply)
        if links is not None:
            out.print(links)

    emit(out, chosen, records, document=reply, md_columns=STATUS_COLUMNS, table=tables)


RUN_COLUMNS = ("model_filename", "n_prompt", "n_gen", "world", "ttft_s", "prefill_s",
               "decode_tps", "e2e_s", "stages", "lost", "tokens")


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
    """
    from strata.ring.control.wire import parse_addr, request
    from strata.views.ring import run_record, run_table

    chosen = output_format(fmt, json_out)
    check_positive("--timeout", timeout)
    if not n_predict.isdigit() or int(n_predict) < 1:
        raise InputError(f"-n {n_predict}: give a whole number of tokens >= 1")
    if temperature < 0:
        raise InputError(f"--temperature {temperature}: must be >= 0")
    reply = request(*parse_addr(connect), {"op": "run", "model": model, "prompt": prompt,
                                           "n": int(n_predict), "seed": seed,
                                           "temperature": temperature},
                    timeout_s=timeout, connect_timeout_s=timeout)
    reply.pop("ok", None)
    emit(out, chosen, [run_record(reply)], document=reply, md_columns=RUN_COLUMNS,
         table=lambda: run_table(reply, out))


# `strata ring plan` lives in its own module (helper D's); importing it registers it here.
from strata.cli import ring_plan  # noqa: E402, F401
