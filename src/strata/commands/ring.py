"""`strata ring serve|status|run|plan`: checks first, then the work. The CLI (cli/ring.py,
cli/ring_plan.py) parses the flags, calls one of these and prints what it returns
(views/ring.py, views/ring_plan.py); the domain is strata.ring (plan/, runtime/, control/)."""

from __future__ import annotations

import json
import signal
import socket
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from strata.errors import InputError
from strata.ring.control.wire import DEFAULT_PORT
from strata.ring.plan.links import Link
from strata.ring.plan.members import GiB, Member
from strata.ring.plan.types import LayerTime

if TYPE_CHECKING:
    from strata.ring.control.node import Node
    from strata.ring.plan.types import RingPlan


def _positive(name: str, value: float) -> None:
    if value <= 0:
        raise InputError(f"{name} must be > 0 (got {value})")


def _store(db: Path | None) -> sqlite3.Connection | None:
    """The results DB read-only, or None when there is none (nothing is created)."""
    from strata.paths import default_db_path
    from strata.store.db import open_db_readonly

    return open_db_readonly(Path(db or default_db_path()).expanduser())


# -- serve --------------------------------------------------------------------------------

@dataclass
class ServeOptions:
    """`strata ring serve`'s flags."""

    name: str | None = None
    port: int = DEFAULT_PORT
    peers: str | None = None
    device: str = "cpu"
    ops: str = "lab"
    mem_cap: float | None = None  # GiB
    threads: str | None = None  # a whole number (bench's -t takes lists; this one, one)
    host: str | None = None  # None: the address mDNS advertises, and loopback
    mdns: bool = True
    timeout: float = 3.0
    db: Path | None = None
    models: list[Path] | None = None  # what peers may name (default: the current directory)
    secret_file: Path | None = None
    api: int | None = None  # the OpenAI-compatible endpoint's port
    version_as: str | None = None  # test hook: pretend another strata version
    die_at: int | None = None  # test hook: crash mid-generation


def serve(options: ServeOptions, log: Callable[[str], None],
          started: Callable[[Node], None]) -> None:
    """Run a ring node until SIGTERM or SIGINT: the flags are checked first, then the port is
    bound (one in use fails in one line before the host is probed), then the node joins the
    members it finds; `started(node)` once it serves. Returns after the node said bye."""
    node, socks = _node(options, log)
    # Before start: registering with mDNS takes a second or two, and a SIGTERM meanwhile
    # must still end in a clean stop.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: node.stopped.set())
    node.start(socks[0], socks[1:])
    api = None
    try:
        api = _start_api(node, options, [s.getsockname()[0] for s in socks], log)
        started(node)
        while not node.stopped.wait(0.5):
            pass
    finally:
        if api is not None:
            api.stop()
        node.stopped.clear()  # stop() says bye only once; it sets the event again
        node.stop()


def _start_api(node: Node, o: ServeOptions, hosts: list[str],
               log: Callable[[str], None]) -> Any:
    """`--api PORT`: the OpenAI-compatible endpoint on this member, the ring secret as its
    bearer token, on the addresses the control port listens on."""
    if o.api is None:
        return None
    from strata.ring.control.api import start_api

    return start_api(node, hosts, o.api, node.config.secret.decode(), log)


def _node(o: ServeOptions, log: Callable[[str], None]) -> tuple[Node, list[socket.socket]]:
    from strata.engine.ops import names as ops_names
    from strata.ring.control import auth
    from strata.ring.control.models import ModelDirs
    from strata.ring.control.node import Node, NodeConfig
    from strata.ring.control.wire import parse_peers

    _positive("--timeout", o.timeout)
    if o.ops not in ops_names():
        raise InputError(f"--ops {o.ops}: choose one of {', '.join(ops_names())}")
    if o.mem_cap is not None:
        _positive("--mem-cap", o.mem_cap)
    threads = None
    if o.threads is not None:
        if not o.threads.strip().isdigit() or int(o.threads) < 1:
            raise InputError(f"--threads {o.threads}: give a whole number of threads >= 1")
        threads = int(o.threads)
    if o.api is not None and not 0 < o.api < 65536:
        raise InputError(f"--api {o.api}: give a TCP port 1-65535")
    models = ModelDirs.of(o.models)
    secret = auth.load(o.secret_file, create=True)
    host = o.host if o.host is not None else _advertised("")
    config = NodeConfig(name=o.name or _default_name(o.port), host=host, port=o.port,
                        peers=parse_peers(o.peers), device=o.device, ops=o.ops, mdns=o.mdns,
                        mem_cap_bytes=None if o.mem_cap is None else int(o.mem_cap * GiB),
                        heartbeat_s=o.timeout / 6, timeout_s=o.timeout, db=o.db,
                        threads=threads, secret=secret.key, models=models)
    # The port first: one that is in use fails in one line before the host is probed.
    socks = _listen(o.host, host, o.port)
    auth.use(secret)  # this daemon's own connections prove the same secret
    if secret.created:
        log(f"ring secret: generated {secret.source} (mode 600): {secret.key.decode()} — "
            f"give every other member and client the same one ({auth.ENV}=… or "
            "--secret-file)")
    if o.version_as:
        config.version = o.version_as
    config.die_at = o.die_at
    member = Member.local(o.device, name=config.name, host=_advertised(host), port=o.port,
                          mem_cap_bytes=config.mem_cap_bytes, conn=_store(o.db))
    return Node(config, member, log=log), socks


def _listen(given: str | None, host: str, port: int) -> list[socket.socket]:
    """The control port's sockets: on `host`, and on loopback too when no --host was given
    (the CLI on this machine reaches its daemon at 127.0.0.1; other machines at the address
    mDNS advertises; no other interface — a container bridge, a VPN — listens)."""
    from strata.ring.control.wire import bind

    first = bind(host, port)
    if given is not None or host.startswith("127."):
        return [first]
    try:
        return [first, bind("127.0.0.1", first.getsockname()[1])]
    except InputError:
        first.close()
        raise


def _default_name(port: int) -> str:
    host = socket.gethostname().split(".")[0] or "node"
    return host if port == DEFAULT_PORT else f"{host}-{port}"


def _advertised(host: str) -> str:
    from strata.ring.control.discovery import _primary_address

    return _primary_address() if host in ("", "0.0.0.0") else host


# -- status, run --------------------------------------------------------------------------

def _ask(connect: str, msg: dict[str, Any], timeout: float,
         on_progress: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    from strata.ring.control.wire import parse_addr, request

    reply = request(*parse_addr(connect), msg, timeout_s=timeout, connect_timeout_s=timeout,
                    on_progress=on_progress)
    reply.pop("ok", None)
    return reply


def status(connect: str, timeout: float) -> dict[str, Any]:
    """`strata ring status`: the daemon's view of the ring (its status reply)."""
    _positive("--timeout", timeout)
    return _ask(connect, {"op": "status"}, timeout)


def run(model: str, prompt: str, n_predict: str, seed: int | None, temperature: float,
        connect: str, timeout: float, chat: bool = False,
        on_text: Callable[[str], None] | None = None, kv_type: str = "f16") -> dict[str, Any]:
    """`strata ring run`: one generation across the ring, asked of the daemon at `connect`
    (it passes the request to the leader); `on_text` hears the text as it is generated.
    Under `chat` the reply ends at the model's end-of-turn token."""
    _positive("--timeout", timeout)
    if not n_predict.isdigit() or int(n_predict) < 1:
        raise InputError(f"-n {n_predict}: give a whole number of tokens >= 1")
    if temperature < 0:
        raise InputError(f"--temperature {temperature}: must be >= 0")
    _kv_bytes(kv_type)
    msg = {"op": "run", "model": model, "prompt": prompt, "n": int(n_predict), "seed": seed,
           "temperature": temperature, "chat": chat, "stop_eog": chat,
           "stream": on_text is not None, "kv_type": kv_type}
    return _ask(connect, msg, timeout, None if on_text is None else
                lambda piece: on_text(str(piece.get("text", ""))))


def _kv_bytes(kv_type: str) -> float:
    """Bytes of one element of a `kv_type` K/V cache (q8_0: 34/32); InputError for a type
    the stages cannot hold."""
    from strata.engine.kvcache import KV_TYPES

    if kv_type not in KV_TYPES:
        raise InputError(f"--kv-type {kv_type}: choose one of {', '.join(KV_TYPES)}")
    return KV_TYPES[kv_type].elem_bytes


# -- plan ---------------------------------------------------------------------------------

@dataclass
class PlanOptions:
    """`strata ring plan`'s flags (members: --connect, --members, --node, else this host)."""

    model: str
    nodes: list[str]
    members_files: list[Path]
    connect: str | None = None
    mem_cap: float | None = None  # GiB, every member
    link: str | None = None  # RTT_MS:MB/S of every link not measured
    ctx: int | None = None
    ops: str = "lab"
    db: Path | None = None
    kv_type: str = "f16"  # the stages' K/V cache, as `ring run --kv-type`


def plan(o: PlanOptions, console: Console) -> RingPlan:
    """The plan `strata ring plan` prints; `console` shows what is being waited for."""
    from strata.fit.plan import DEFAULT_CTX
    from strata.ring.plan.partition import HELD_DTYPE, plan_ring

    if o.ops not in HELD_DTYPE:
        raise InputError(f"--ops {o.ops}: choose one of {', '.join(HELD_DTYPE)}")
    elem = _kv_bytes(o.kv_type)
    _runnable(o.model, o.ops, o.kv_type)
    if o.mem_cap is not None:
        _positive("--mem-cap", o.mem_cap)
    given = _given_link(o.link)
    members, measured = _members(o.nodes, o.members_files, o.connect, o.db, console)
    if o.mem_cap is not None:
        from strata.ring.plan.members import capped

        members = [capped(m, int(o.mem_cap * GiB)) for m in members]
    links = _all_links(members, measured, given)
    times, missing, why = _daemon_times(o.connect, o.model, console) \
        if o.connect is not None else ({}, {}, "")
    result = plan_ring(o.model, members, DEFAULT_CTX if o.ctx is None else o.ctx, links,
                       weights_dtype=HELD_DTYPE[o.ops], measured=times,
                       kv_elem_bytes=elem)
    if o.connect is not None:
        from strata.ring.control.layer_time import estimate_notes

        result.notes += estimate_notes(times, missing, [s.member for s in result.stages],
                                       why)
    return result


def _runnable(model: str, ops: str, kv: str = "f16") -> None:
    """No plan for what the stages cannot run: their ops' own check of the model first (the
    lab's architectures and storage types; torch's GGUF loader's architectures), then a
    `kv` cache of its heads (q8_0: whole blocks)."""
    from strata.backends import describe
    from strata.engine.kvcache import kv_type
    from strata.models.source import resolve

    check = describe(ops).check
    resolved = resolve(model)
    why = check(resolved) if check is not None and resolved.spec is not None else None
    if why:
        raise InputError(f"MODEL {model}: ring stages cannot run it with --ops {ops}: {why}")
    if resolved.spec is not None:
        kv_type(kv).check(resolved.spec.head_dim)


def _given_link(text: str | None) -> Link | None:
    from strata.ring.plan.links import parse_link

    return parse_link(text) if text is not None else None


def _members(nodes: list[str], files: list[Path], connect: str | None, db: Path | None,
             console: Console) -> tuple[list[Member], dict[tuple[str, str], Link]]:
    from strata.ring.plan import links as ring_links
    from strata.ring.plan import members as ring_members

    out_members: list[Member] = [ring_members.emulated(n) for n in nodes]
    measured: dict[tuple[str, str], Link] = {}
    docs = [(_read_json(f), str(f)) for f in files]
    if connect is not None:
        docs.append((_ask(connect, {"op": "status"}, 5.0), f"--connect {connect}"))
    for doc, where in docs:
        out_members += ring_members.from_document(doc, where)
        measured.update(ring_links.from_document(doc, where))
    if not out_members:  # this host alone
        with console.status("probing host…"):
            out_members = [Member.local(conn=_store(db))]
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


def _daemon_times(connect: str, model: str, console: Console
                  ) -> tuple[dict[str, LayerTime], dict[str, str], str]:
    """Every live member's timed decoder layer of `model`, gathered by the daemon (each
    member times its own, in parallel); a daemon that cannot (an older one) leaves every
    member on the bandwidth x η estimate, and the notes say why."""
    from strata.ring.control.layer_time import GATHER_TIMEOUT_S
    from strata.ring.control.wire import PeerError, parse_addr, request

    try:
        with console.status("timing a decoder layer on each member…"):
            reply = request(*parse_addr(connect), {"op": "layer_times", "model": model},
                            timeout_s=GATHER_TIMEOUT_S + 5.0, connect_timeout_s=5.0)
        times = {str(k): LayerTime.from_dict(v) for k, v in dict(reply["times"]).items()}
        missing = {str(k): str(v) for k, v in dict(reply.get("missing") or {}).items()}
        return times, missing, "no layer time"
    except (PeerError, KeyError, ValueError, TypeError) as exc:
        return {}, {}, f"no layer times from --connect {connect} ({exc})"
