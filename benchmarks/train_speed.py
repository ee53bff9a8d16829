"""`strata train` speed: the lab's kernels (`--kernels lab`) against the plain-PyTorch twin
(`--kernels torch`), measured side by side in one run on this host.

Prints, for the `tiny` preset (or --preset):
  1. whole training steps (forward + backward + AdamW) per second and tokens/s for each, in
     interleaved rounds, their ratio, and MFU against this host's measured fp32 peak;
  2. per op, forward and backward times of the lab's custom op vs the torch twin at the
     preset's shapes (which ops win, which lose);
  3. with --kernel-bench: `strata kernels bench` of the six training ops against torch
     eager at their training shapes (the lab's own harness: cold cache, re-checks);
  4. with --matmul: the lab's `matmul` (verified first) against torch.matmul at the model's
     projection shapes, forward (X W) and the two backward products (dY W^T, X^T dY) — the
     projections stay nn.Linear in both ops sets, and this says whether a lab matmul would win.

Usage:  .venv/bin/python benchmarks/train_speed.py [--preset tiny] [--rounds 3]
        [--steps 10] [--threads N] [--kernel-bench] [--matmul] [--home DIR]
Uses a temporary STRATA_HOME (the kernels are verified there first), never the user's DB;
--home DIR reuses one (e.g. a `strata train` run's: its roofline and verdicts, no re-measuring).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TRAINING_OPS = ("rmsnorm_backward", "silu_mul_backward", "rope_backward", "attention_lse",
                "attention_backward", "cross_entropy_fused")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--kernel-bench", action="store_true")
    p.add_argument("--matmul", action="store_true")
    p.add_argument("--home", type=Path, help="STRATA_HOME to use (default: a new temporary one)")
    return p.parse_args()


def step_times(cfg, ops_by_name, rounds: int, steps: int, batch: int) -> dict[str, list[float]]:
    import torch

    from strata.train.model import Llama

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab, (batch, cfg.ctx + 1), generator=gen)
    x, y = ids[:, :-1], ids[:, 1:]
    times: dict[str, list[float]] = {name: [] for name in ops_by_name}
    for _ in range(rounds):
        for name, ops in ops_by_name.items():  # interleaved: drift hits both alike
            torch.manual_seed(0)
            model = Llama(cfg, ops)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            for i in range(steps + 2):
                if i == 2:
                    start = time.perf_counter()
                opt.zero_grad()
                model(x, y)[1].backward()
                opt.step()
            times[name].append((time.perf_counter() - start) / steps)
    return times


def op_times(cfg, lab, twin, batch: int, reps: int = 20) -> list[tuple[str, float, float,
                                                                      float, float]]:
    """(op, lab fwd s, lab bwd s, torch fwd s, torch bwd s) at the preset's shapes."""
    import torch

    b, t, h, hkv, d = batch, cfg.ctx, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    g = torch.Generator().manual_seed(1)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    ang = torch.arange(t)[:, None] * (1e4 ** (-torch.arange(0, d, 2) / d))[None]
    cos, sin = ang.cos(), ang.sin()
    targets = torch.randint(0, cfg.vocab, (b * t,), generator=g)
    cases = {
        "rmsnorm": (lambda o, x, w: o.rmsnorm(x, w, cfg.eps), (r(b, t, cfg.hidden), r(cfg.hidden))),
        "silu_mul": (lambda o, a, c: o.silu_mul(a, c), (r(b, t, cfg.ffn), r(b, t, cfg.ffn))),
        "rope": (lambda o, x: o.rope(x, cos, sin), (r(b, t, h, d),)),
        "attention": (lambda o, q, k, v: o.attention(q, k, v, d ** -0.5),
                      (r(b, h, t, d), r(b, hkv, t, d), r(b, hkv, t, d))),
        "cross_entropy": (lambda o, z: o.cross_entropy(z, targets), (r(b * t, cfg.vocab),)),
    }
    rows = []
    for op, (fn, inputs) in cases.items():
        timed = []
        for ops in (lab, twin):
            fwd, bwd = [], []
            for _ in range(reps):
                xs = [x.clone().requires_grad_() for x in inputs]
                t0 = time.perf_counter()
                out = fn(ops, *xs)
                t1 = time.perf_counter()
                out.backward(torch.ones_like(out))
                t2 = time.perf_counter()
                fwd.append(t1 - t0)
                bwd.append(t2 - t1)
            timed += [statistics.median(fwd), statistics.median(bwd)]
        rows.append((op, *timed))
    return rows


def matmul_times(cfg, batch: int, conn, reps: int = 10) -> list[tuple[str, float, float]]:
    """(product, lab s, torch s): medians of `reps` calls on contiguous operands (a transposed
    operand is materialised before timing, for both)."""
    import torch

    from strata.commands.kernels import session
    from strata.kernels import Choice
    from strata.kernels.dispatch import resolve
    from strata.kernels.ensure import ensure_verified
    from strata.kernels.spec import get_spec

    s = session(conn=conn)
    ensure_verified(s, ["matmul"], "cpu", lambda m: None)
    choice = Choice(resolve("matmul", "cpu", s), get_spec("matmul"))
    m, h, kv = batch * cfg.ctx, cfg.hidden, cfg.n_kv_heads * cfg.head_dim
    weights = {"q/o proj": (h, h), "k/v proj": (h, kv), "gate/up": (h, cfg.ffn),
               "down": (cfg.ffn, h), "head": (h, cfg.vocab)}
    g = torch.Generator().manual_seed(2)
    rows = []
    for name, (k, n) in weights.items():
        for label, (a_shape, b_shape) in {"X W": ((m, k), (k, n)), "dY W^T": ((m, n), (n, k)),
                                          "X^T dY": ((k, m), (m, n))}.items():
            a, b = torch.randn(*a_shape, generator=g), torch.randn(*b_shape, generator=g)
            out = torch.empty(a_shape[0], b_shape[1])
            lab, ref = [], []
            for _ in range(reps):
                t0 = time.perf_counter()
                choice.run_packed(out, a, b)
                t1 = time.perf_counter()
                torch.matmul(a, b)
                ref.append(time.perf_counter() - t1)
                lab.append(t1 - t0)
            rows.append((f"{name} {label} {a_shape[0]}x{a_shape[1]}x{b_shape[1]}",
                         statistics.median(lab), statistics.median(ref)))
    print(f"   lab matmul implementation: {choice.decision.chosen}")
    return rows


def main() -> None:
    args = _args()
    home = args.home or Path(tempfile.mkdtemp(prefix="strata-train-speed-"))
    os.environ["STRATA_HOME"] = str(home)
    import torch

    from strata.host import this_host
    from strata.store import open_db
    from strata.train.ops_lab import LabOps
    from strata.train.ops_torch import TorchOps
    from strata.train.presets import PRESETS
    from strata.views.console import make_console

    torch.set_num_threads(args.threads)
    preset = PRESETS[args.preset]
    cfg = preset.model
    conn = open_db(home / "strata.db")
    host = this_host(conn)
    roof = host.roofline(make_console(stderr=True))
    peak = roof.devices[0].compute["fp32"].value * 1e9
    lab = LabOps("cpu", conn, say=lambda m: print(f"  {m}", file=sys.stderr))
    print(f"host: {host.profile.cpu.model}, {args.threads} threads; fp32 peak "
          f"{peak / 1e9:.1f} GFLOP/s (measured{', host busy' if roof.measured_busy else ''})")
    print(f"preset {preset.name}: {cfg}, batch {preset.batch}")
    print("lab kernels: " + ", ".join(f"{op}={v['impl']}" for op, v in lab.served().items()))

    from strata.train.model import flops_per_token

    times = step_times(cfg, {"torch": TorchOps(), "lab": lab}, args.rounds, args.steps,
                       preset.batch)
    tokens = preset.batch * cfg.ctx
    print("\n1. whole steps (forward + backward + AdamW), median of rounds:")
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, s in med.items():
        tps = tokens / s
        print(f"   {name:5s} {s * 1e3:8.1f} ms/step  {tps:9.0f} tokens/s  MFU "
              f"{tps * flops_per_token(cfg) / peak:.1%}  (rounds: "
              + ", ".join(f"{x * 1e3:.1f}" for x in times[name]) + " ms)")
    print(f"   tokens/s lab / torch = {med['torch'] / med['lab']:.3f}")

    print("\n2. per op at the preset's shapes, median of 20 (ms): lab fwd, bwd | torch fwd, "
          "bwd | lab/torch speed (fwd+bwd)")
    for op, lf, lb, tf, tb in op_times(cfg, lab, TorchOps(), preset.batch):
        print(f"   {op:14s} {lf * 1e3:7.2f} {lb * 1e3:7.2f} | {tf * 1e3:7.2f} {tb * 1e3:7.2f} |"
              f" {(tf + tb) / (lf + lb):5.2f}x")
    if args.matmul:
        print("\n4. matmul at the projection shapes, median of 10 (ms): lab | torch | lab/torch "
              "speed")
        for name, lab_s, torch_s in matmul_times(cfg, preset.batch, conn):
            print(f"   {name:32s} {lab_s * 1e3:7.2f} | {torch_s * 1e3:7.2f} | "
                  f"{torch_s / lab_s:5.2f}x")
    if args.kernel_bench:
        print("\n3. strata kernels bench (the lab's harness, cold cache, vs torch eager):")
        for op in TRAINING_OPS:
            subprocess.run([sys.executable, "-m", "strata.cli", "kernels", "bench", op,
                            "--no-compile", "--max-time", "0.2", "-o", "md"], check=False)


if __name__ == "__main__":
    main()
