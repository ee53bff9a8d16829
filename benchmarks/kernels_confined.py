"""What confinement costs: untrusted kernels served from their own confined worker (shared
memory in, shared memory out) against the same kernel bytes in-process, side by side in one
run, and the time the separate judge adds to `strata kernels bench`.

Prints:
  1. per lab op of a decode step (model default synthetic:smollm2-135m@q8_0): µs per call
     in-process vs confined (the lab's own per-op profile, every op's kernel the same
     implementation, loaded as a built-in or as an untrusted copy), and the difference —
     the per-call overhead of a confined call (one round trip to the worker);
  2. `-B lab` decode t/s with every kernel in-process, with one untrusted kernel confined
     (--confine, default rmsnorm: 2 calls per layer), and with every op confined;
  3. with --old-tree DIR (a checkout of the judge before this change, e.g.
     `git worktree add /tmp/old 89a6472`): wall time of `strata kernels bench OP --shapes
     figure --no-compile` on both trees, on fresh homes, and the channel's round trip that
     the new harness subtracts.

Usage: .venv/bin/python benchmarks/kernels_confined.py [--model REF] [--tokens 32]
       [--confine rmsnorm] [--old-tree DIR] [--bench-op rmsnorm]
Uses temporary STRATA_HOMEs, never the user's DB. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _gguf(ref: str, home: Path) -> Path:
    from strata.models.source import resolve

    return resolve(ref).path("gguf", "lab")


def _external_copy(impl: object) -> object:
    """The same kernel file, as a kernel that did not ship with strata (untrusted)."""
    from strata.kernels.impl import from_source

    return from_source(impl.source, origin="external", name=f"{impl.dialect}.ext.copy")


def _confine(model: object, ops: list[str]) -> None:
    """Serve `ops` from confined copies of the kernels dispatch chose (same bytes)."""
    from strata.kernels import Choice
    from strata.kernels.dispatch import Decision

    for op in ops:
        old = model.kernels.choices[op]
        if old.decision.impl is None:
            continue
        impl = _external_copy(old.decision.impl)
        model.kernels.choices[op] = Choice(Decision(op, "cpu", "kernel", impl, confined=True),
                                           old.spec, caps=old.caps)
    model._step = None  # the decode step binds its calls again


def _decode(model: object, tokens: int) -> tuple[float, dict[str, tuple[float, int]]]:
    """(decode t/s, op -> (seconds, calls) of a profiled run)."""
    model.reset(512)
    model.prefill([1, 2, 3, 4])
    model.decode(5)  # binds the step (and moves confined tensors to shared memory once)
    t0 = time.perf_counter()
    for i in range(tokens):
        model.decode(6 + i % 50)
    tps = tokens / (time.perf_counter() - t0)
    model.kernels.profile = True
    model.kernels.seconds.clear()
    model.kernels.calls.clear()
    model.reset(512)
    model.prefill([1, 2, 3, 4])
    for i in range(tokens):
        model.decode(6 + i % 50)
    model.kernels.profile = False
    prof = {op: (model.kernels.seconds[op], model.kernels.calls[op])
            for op in model.kernels.calls}
    return tps, prof


def lab_figures(args: argparse.Namespace) -> None:
    import strata.lab

    path = _gguf(args.model, Path(os.environ["STRATA_HOME"]))
    inproc = strata.lab.load(path, say=lambda m: print("  " + m, file=sys.stderr))
    ops = list(inproc.kernels.choices)
    print(f"model {args.model}: ops {', '.join(ops)}; served by "
          + ", ".join(f"{op}={c.decision.chosen}" for op, c in inproc.kernels.choices.items()))
    tps_in, prof_in = _decode(inproc, args.tokens)
    one = strata.lab.load(path)
    _confine(one, [args.confine])
    tps_one, _ = _decode(one, args.tokens)
    every = strata.lab.load(path)
    _confine(every, ops)
    tps_all, prof_all = _decode(every, args.tokens)
    print("\n1. per call, µs (decode step profile: each call timed around, device synced)")
    print(f"{'op':<18}{'calls/token':>12}{'in-process':>12}{'confined':>12}{'overhead':>12}")
    for op in ops:
        if op not in prof_in or op not in prof_all:
            continue
        (s_in, n_in), (s_c, n_c) = prof_in[op], prof_all[op]
        a, b = 1e6 * s_in / n_in, 1e6 * s_c / n_c
        print(f"{op:<18}{n_in / args.tokens:>12.0f}{a:>12.1f}{b:>12.1f}{b - a:>12.1f}")
    print("\n2. -B lab decode, t/s")
    print(f"  every kernel in-process       {tps_in:8.1f}")
    print(f"  {args.confine} confined (untrusted) {tps_one:8.1f}  "
          f"({tps_one / tps_in:.2f}x)")
    print(f"  every op confined             {tps_all:8.1f}  ({tps_all / tps_in:.2f}x)")


def bench_wall(tree: Path, op: str) -> tuple[float, int]:
    """Seconds of `strata kernels bench OP --shapes figure --no-compile` on a fresh home
    (verification included), run from `tree`'s sources; its exit code."""
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "STRATA_HOME": home, "PYTHONPATH": str(tree / "src")}
        seed = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
                "from tests.seed_host import seed_host; seed_host(Path(sys.argv[2]))")
        subprocess.run([sys.executable, "-c", seed, str(ROOT), home], env=env, check=False,
                       capture_output=True)
        cmd = [sys.executable, "-m", "strata.cli", "kernels", "verify", op]
        subprocess.run(cmd, env=env, check=False, capture_output=True)
        t0 = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "strata.cli", "kernels", "bench", op,
                              "--shapes", "figure", "--no-compile"], env=env,
                             capture_output=True, check=False)
        return time.perf_counter() - t0, run.returncode


def overhead_figure() -> float:
    from strata.kernels.process import WorkerSpec, worker
    from strata.kernels.timing import measure_overhead

    with worker(WorkerSpec(confined=False, torch=False)) as proc:
        return measure_overhead(proc, 200)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="synthetic:smollm2-135m@q8_0")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--confine", default="rmsnorm")
    p.add_argument("--old-tree", type=Path)
    p.add_argument("--bench-op", default="rmsnorm")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as home:
        os.environ["STRATA_HOME"] = home
        lab_figures(args)
        print(f"\nthe channel's round trip (min of 200 null requests): "
              f"{overhead_figure() * 1e6:.1f} µs")
    if args.old_tree:
        print(f"\n3. strata kernels bench {args.bench_op} --shapes figure --no-compile "
              "(fresh home, after verify), wall s")
        new, rc_new = bench_wall(ROOT, args.bench_op)
        old, rc_old = bench_wall(args.old_tree, args.bench_op)
        print(f"  judge in its own process (this tree) {new:7.1f} s (exit {rc_new})")
        print(f"  judge in the kernel's worker (old)   {old:7.1f} s (exit {rc_old})")
        print(f"  added: {new - old:+.1f} s ({new / old:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
