"""Ring vs single process on this one machine: overhead and correctness, NOT scaling.

    .venv/bin/python benchmarks/ring_vs_single.py [--model synthetic:smollm2-135m@f32]
        [-p 64] [-n 32] [-r 3] [--home DIR] [--ops lab,torch]

Every ring member here is a process on the same host, so the nodes share its cores (2 on
the machine this was written on): a ring cannot be faster than one process here, and each
extra stage adds its activations' trip and a process switch per token. What this measures
is what the ring costs over one process, and that it works under a memory cap that one node
alone could not meet.

Rows (same random prompt sizes, same metric code: strata.bench.metrics.compute):
  torch       strata's torch backend, in this process, float32 (the single-process baseline)
  ring x1     one `strata ring serve` daemon, no cap: the ring's stage code with one stage,
              once per --ops (lab: the GGUF's blocks on lab kernels; torch: float32), with
              the weight bytes each stage holds (strata.ring.runtime.stage.stage_bytes)
  ring x2/x3  2 / 3 daemons (the first --ops), each with a --mem-cap that lets no fewer
              members hold the model (found with strata.ring.plan.partition), asked through
              `-B ring` (RingBackend)
Figures: prefill t/s, decode t/s, TTFT, ITL p50/p90, bytes per token per link, the plan's
predicted ms/token vs the measured one (the daemons' roofline is measured first with
`strata probe --measure`). Churn (LocalRing, 3 worker processes, C's runtime): the last
stage is SIGKILLed mid-generation; time to detect, to re-form a 2-rank group, to replay,
and the gap from the last token before to the first token after.

Links with real latency (tc netem in a network namespace) are attempted only if `tc qdisc
add ... netem` works in `unshare --user --net`; otherwise the reason is printed.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STRATA = [sys.executable, "-m", "strata.cli"]
GIB = 1024**3


@dataclass
class Row:
    name: str
    prefill_tps: list[float] = field(default_factory=list)
    decode_tps: list[float] = field(default_factory=list)
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    links: str = "-"
    predicted_ms: float | None = None
    plan: str = "-"
    timeline: dict[str, Any] | None = None  # the last request's (pipeline.timeline)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- caps: the smallest per-node cap with which `world` members, and no fewer, hold it -------


def cap_for(model: str, world: int, ctx: int, ops: str) -> int:
    from strata.errors import InputError
    from strata.ring.plan.members import Member
    from strata.ring.plan.partition import HELD_DTYPE, plan_ring

    def members(n: int, cap: int) -> list[Member]:
        return [Member(f"m{i}", "127.0.0.1", 0, "cpu", 64 * GIB, cap, None, None, "x", 0)
                for i in range(n)]

    def fits(n: int, cap: int) -> bool:
        try:
            return len(plan_ring(model, members(n, cap), ctx,
                                 weights_dtype=HELD_DTYPE[ops]).stages) <= n
        except InputError:
            return False

    lo, hi = 0, 64 * GIB  # bisect the smallest cap `world` members can meet (to 0.5%)
    while hi - lo > hi // 200:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(world, mid) else (mid, hi)
    cap = int(hi * 1.03)  # a little room: the plan, not the edge, should decide
    if fits(world - 1, cap):
        raise SystemExit(f"cap {cap / GIB:.3f} GiB lets {world - 1} members hold {model}")
    return cap


# -- daemons ---------------------------------------------------------------------------------


class Daemons:
    def __init__(self, home: Path) -> None:
        self.home, self.procs, self.ports = home, {}, {}
        # one ring secret for the daemons and this process's requests (ring serve's auth)
        os.environ.setdefault("STRATA_RING_SECRET", os.urandom(16).hex())
        self.env = {**os.environ, "STRATA_HOME": str(home), "STRATA_PROGRESS": "0"}

    def start(self, names: list[str], cap: int | None, ops: str, threads: int) -> str:
        from strata.ring.control import wire

        first = None
        for name in names:
            port = free_port()
            cmd = [*STRATA, "ring", "serve", "--name", name, "--port", str(port), "--host",
                   "127.0.0.1", "--no-mdns", "--timeout", "3", "--ops", ops, "-t",
                   str(threads)]
            cmd += ["--mem-cap", f"{cap / GIB:.6f}"] if cap else []
            cmd += ["--peers", first] if first else []
            log = (self.home / f"{name}.log").open("ab")
            self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                                env=self.env)
            self.ports[name] = port
            first = first or f"127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        want = set(names) - {names[0]}
        while time.monotonic() < deadline:
            try:
                st = wire.request("127.0.0.1", self.ports[names[0]], {"op": "status"})
                if {p["member"]["id"] for p in st["peers"] if p["state"] == "live"} >= want:
                    return str(first)
            except wire.PeerError:
                pass
            time.sleep(0.3)
        raise SystemExit(f"daemons {names} never formed a ring")

    def stop(self) -> None:
        for proc in self.procs.values():
            proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()


# -- one backend, the bench's requests -----------------------------------------------------------


def measure(backend: Any, row: Row, n_prompt: int, n_gen: int, reps: int) -> Row:
    from strata.backends.base import RunRequest
    from strata.bench.metrics import compute

    bos = backend.bos()
    for i in range(reps + 1):  # the first is a warm-up (the members load their layers)
        head = [bos] if bos is not None else []
        prompt = head + backend.random_tokens(n_prompt - len(head), 1000 + i)
        m = compute(backend.run(RunRequest((), tuple(prompt), n_gen)))
        if i == 0:
            continue
        row.prefill_tps.append(m.prefill_tps or 0.0)
        row.decode_tps.append(m.decode_tps or 0.0)
        row.ttft_s.append(m.ttft_s or 0.0)
        row.itl_s += m.itl_s
    return row


def single_torch(model: Any, args: argparse.Namespace) -> Row:
    from strata.backends import create
    from strata.backends.base import LoadConfig

    b = create("torch")
    b.load(model, LoadConfig(device="cpu", dtype="float32"))
    try:
        return measure(b, Row("torch (1 process)"), args.p, args.n, args.r)
    finally:
        b.close()


def single_lab(model: Any, args: argparse.Namespace) -> Row:
    from strata.backends import create
    from strata.backends.base import LoadConfig

    b = create("lab")
    b.load(model, LoadConfig(threads=args.threads, n_ctx=args.p + args.n + 16))
    try:
        return measure(b, Row(f"-B lab -t {args.threads} (1 process)"), args.p, args.n,
                       args.r)
    finally:
        b.close()


def ring_row(model: Any, args: argparse.Namespace, world: int, home: Path, ops: str) -> Row:
    from strata.backends import create
    from strata.backends.base import LoadConfig
    from strata.backends.ring import link_bytes
    from strata.ring.runtime.stage import stage_bytes

    cap = cap_for(args.model, world, args.p + args.n + 1, ops) if world > 1 else None
    daemons = Daemons(home)
    try:
        threads = max(1, args.threads // world)  # the host's cores split between members
        os.environ["STRATA_RING"] = daemons.start([f"n{i}" for i in range(world)], cap, ops,
                                                  threads)
        b = create("ring")
        b.load(model, LoadConfig())
        capped = f", cap {cap / 2**20:.0f} MiB/node" if cap else ", no cap"
        spec = model.spec_for("gguf")
        held = stage_bytes(spec, 0, spec.n_layers, 0, ops)[0] / 2**20
        row = measure(b, Row(f"ring x{world} {ops} -t {threads} ({held:.0f} MiB){capped}"),
                      args.p, args.n, args.r)
        last = b._last  # the last reply: its plan and link counters
        row.plan = " ".join(f"{s['member']}[{s['first']},{s['last']})" for s in last["stages"])
        row.links = ", ".join(f"{x['src']}>{x['dst']} {x['bytes_per_token']:.0f}"
                              for x in link_bytes(last)) or "-"
        row.predicted_ms = last.get("predicted_ms_per_token")
        row.timeline = last.get("timeline")
        b.close()
        return row
    finally:
        daemons.stop()


# -- churn: C's LocalRing, the last of 3 stages killed mid-generation ------------------------------


def churn(model_path: str, n_layers: int, args: argparse.Namespace) -> dict[str, float]:
    from strata.ring.runtime.assign import even_split
    from strata.ring.runtime.local import LocalRing

    ring = LocalRing(3).start()
    try:
        def assign(world: int) -> list[tuple[int, int, int]]:
            return [(a.rank, a.first, a.last) for a in even_split(n_layers, world)]

        common = {"port": free_port(), "world": 3, "epoch": 1, "timeout_s": 60.0,
                  "op_timeout_s": 30.0, "model": model_path, "assignments": assign(3)}
        die_at = 1 + args.n // 2  # the prefill is message 1: killed after n/2 tokens
        ring.send(1, op="serve", rank=1, **common)
        ring.send(2, op="serve", rank=2, die_at=die_at, **common)
        prompt = list(range(1, args.p + 1))
        ring.send(0, op="drive", prompt=prompt, n_predict=args.n + 1, **common)
        lost = ring.answer(0, timeout=300)
        killed = ring.answer(2, timeout=10)
        ring.answer(1, timeout=30)  # the survivor leaves the dead epoch
        if lost.get("ok") or "lost" not in lost:
            raise SystemExit(f"churn: expected a lost stage, got {lost}")
        two = {"port": free_port(), "world": 2, "epoch": 2, "timeout_s": 60.0,
               "op_timeout_s": 30.0, "model": model_path, "assignments": assign(2)}
        ring.send(1, op="serve", rank=1, **two)
        ring.send(0, op="resume", **two)
        res = ring.answer(0, timeout=300)
        if not res.get("ok"):
            raise SystemExit(f"churn: resume failed: {res}")
        ring.send(0, op="stop")
        ring.answer(0)
        ring.answer(1)
        r = res["result"]
        resumed = r["resumes"][0]
        gap = r["itl_s"][resumed["at_token"] - 1]  # last token before -> first after
        return {"detect_ms": (lost["at"] - killed["at"]) * 1e3,
                "gloo_detect_ms": lost["detect_s"] * 1e3, "reform_ms": res["reform_s"] * 1e3,
                "replay_ms": resumed["replay_s"] * 1e3, "replayed": resumed["replayed"],
                "at_token": resumed["at_token"], "gap_ms": gap * 1e3,
                "tokens": len(r["tokens"])}
    finally:
        ring.close()


# -- latency links ---------------------------------------------------------------------------


def netem_reason() -> str | None:
    """None when tc netem works in a user+net namespace here, else why not."""
    cmd = ["unshare", "--user", "--map-root-user", "--net", "sh", "-c",
           "ip link set lo up && tc qdisc add dev lo root netem delay 1ms"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unshare failed: {exc}"
    return None if p.returncode == 0 else (p.stderr.strip().splitlines() or ["?"])[-1]


# -- printing --------------------------------------------------------------------------------


def _pct(values: list[float], q: float) -> float:
    from strata.measure.stats import percentile

    return percentile(values, q) if values else float("nan")


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def table(rows: list[Row]) -> str:
    head = (f"{'config':<44} {'prefill t/s':>11} {'decode t/s':>10} {'TTFT ms':>8} "
            f"{'ITL p50':>8} {'ITL p90':>8} {'pred ms/t':>9} {'meas ms/t':>9}  "
            "bytes/token per link; plan")
    lines = [head, "-" * len(head)]
    for r in rows:
        meas = 1e3 / _mean(r.decode_tps)
        pred = f"{r.predicted_ms:.2f}" if r.predicted_ms else "-"
        lines.append(f"{r.name:<44} {_mean(r.prefill_tps):>11.1f} {_mean(r.decode_tps):>10.2f} "
                     f"{_mean(r.ttft_s) * 1e3:>8.1f} {_pct(r.itl_s, 50) * 1e3:>8.2f} "
                     f"{_pct(r.itl_s, 90) * 1e3:>8.2f} {pred:>9} {meas:>9.2f}  "
                     f"{r.links}; {r.plan}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="synthetic:smollm2-135m@f32")
    ap.add_argument("-p", type=int, default=64)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--home", type=Path, default=None)
    ap.add_argument("--skip-probe", action="store_true", help="the home has a roofline")
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1,
                    help="threads in all: -B lab's, and split evenly between a ring's members")
    ap.add_argument("--ops", default="lab,torch",
                    help="the stages' ops, comma-separated (x1 runs each; x2/x3 the first)")
    args = ap.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="ring-bench-"))
    home.mkdir(parents=True, exist_ok=True)
    os.environ["STRATA_HOME"] = str(home)
    t0 = time.perf_counter()
    if not args.skip_probe:  # the plan predicts times from the members' measured roofline
        subprocess.run([*STRATA, "probe", "--measure", "--allow-busy"], check=True,
                       env={**os.environ, "STRATA_PROGRESS": "0"}, capture_output=True)
    from strata.models.source import resolve

    model = resolve(args.model)
    path = str(model.path("gguf", "ring"))  # written once here; the daemons find it cached
    spec = model.spec_for("gguf")
    assert spec is not None
    print(f"{args.model}: {spec.n_layers} layers, {spec.weight_bytes() / 2**20:.0f} MiB as "
          f"stored; pp{args.p} + tg{args.n}, {args.r} reps after a warm-up; home {home}")
    rows = [single_torch(model, args), single_lab(model, args)]
    ops = args.ops.split(",")
    rows += [ring_row(model, args, 1, home, o) for o in ops]
    for world in (2, 3):
        rows.append(ring_row(model, args, world, home, ops[0]))
    print(table(rows))
    lab = _mean(rows[1].decode_tps)
    for row in rows[2:]:
        line = row.timeline or {}
        parts = " + ".join(f"{ms:.2f}" for ms in (line.get("compute_ms_per_token") or {})
                           .values())
        hop = line.get("machinery_ms_per_hop")
        where = (f"; last request per token: compute {parts} ms, machinery "
                 f"{line['machinery_ms_per_token']:.2f} ms"
                 + (f" = {hop:.2f} ms x {line['hops']} hops" if hop is not None else "")
                 if line else "; no timeline")
        meas = 1e3 / _mean(row.decode_tps)
        pred = (f"; predicted {row.predicted_ms:.2f} vs measured {meas:.2f} ms/token "
                f"({row.predicted_ms / meas - 1:+.0%}; goal within 30%)"
                if row.predicted_ms else "; no prediction")
        print(f"  {row.name.split(' (')[0]}: decode {_mean(row.decode_tps) / lab:.2f} x -B lab"
              f" (goals: x1 >= 0.9, x2 >= 0.8){where}{pred}")
    c = churn(path, spec.n_layers, args)
    print(f"churn (3 -> 2 stages, LocalRing, last stage SIGKILLed after {c['at_token']} of "
          f"{c['tokens']} tokens): detected {c['detect_ms']:.0f} ms after the kill (link "
          f"wait {c['gloo_detect_ms']:.0f} ms), 2-rank group re-formed in "
          f"{c['reform_ms']:.0f} ms, {c['replayed']} positions replayed in "
          f"{c['replay_ms']:.0f} ms; last token before -> first token after: "
          f"{c['gap_ms']:.0f} ms")
    reason = netem_reason()
    print("latency links (tc netem): " + (
        "available but not run by this script" if reason is None else f"skipped: {reason}"))
    print(f"NOTE: every node here is a process on this one {os.cpu_count()}-core machine: "
          "the nodes share its cores, so this measures the ring's overhead and correctness, "
          "not scaling (a real ring adds memory, never single-stream speed).")
    print(f"total {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # run the finally blocks
    main()
