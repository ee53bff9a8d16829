"""The lab's convolutions vs torch eager (oneDNN) in one process, back to back, per published
layer: the figure a user calling them from Python sees (issue 28's goal: conv2d 3x3 and 1x1 at
ResNet-50 shapes >= 0.8x oneDNN on this CPU).

  python benchmarks/conv_vs_onednn.py [--ops conv2d_nhwc,conv2d,conv1d] [--set llm]

Each built-in C implementation is loaded in this process (dialects/c.py, as dispatch runs a
built-in) and bound once to one set of tensors; torch eager runs the op's vendor path on the
same tensors (channels-last views for conv2d_nhwc). Per shape and contender: warm-up, then the
best of 3 medians of --calls back-to-back calls, and the ratio eager / kernel. Unlike
`strata kernels bench` (a confined worker whose OpenMP team sleeps between calls, fresh inputs
per call, caches flushed in cold mode), both sides keep their threads and data warm, as in a
model's forward pass. Prints; asserts nothing (speed goals are benchmarks, not tests).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

IMPLS = {"conv2d_nhwc": ("c.avx512", "c.winograd"), "conv2d_nhwc_relu": ("c.avx512",),
         "conv2d": ("c.avx512", "c.im2col"),
         "conv1d": ("c.avx512", "c.im2col")}


def timed(fn: Any, calls: int) -> float:
    fn()
    fn()
    best = float("inf")
    for _ in range(3):
        times = []
        for _ in range(calls):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        best = min(best, statistics.median(times))
    return best


def label(s: dict[str, int]) -> str:
    size = f"{s['H']}x{s['W']}" if "H" in s else f"L={s['L']}"
    extra = f" G={s['G']}" if s["G"] > 1 else ""
    return f"{s['C']}->{s['O']} {size} K={s['K']} S={s['S']}{extra}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", default=",".join(IMPLS))
    ap.add_argument("--set", default="llm", help="the ops' shape set (llm: every published "
                    "layer; figure: ResNet-50's 3x3 and 1x1 layers)")
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()

    import torch

    from strata.host import this_host
    from strata.kernels.dialects.c import load_c
    from strata.kernels.registry import builtin_implementations
    from strata.kernels.spec import get_spec
    from strata.store import open_db

    caps = this_host(open_db(Path(tempfile.mkdtemp(prefix="strata-conv-")) / "s.db")).caps
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, batch 1")
    for op in args.ops.split(","):
        spec = get_spec(op)
        impls = [i for i in builtin_implementations() if i.op == op and i.name in IMPLS[op]
                 and i.requires.check(caps) is None]
        kernels = {i.name: load_c(i, spec, "cpu") for i in impls}
        print(f"\n{op}: x torch eager (>1: the lab is faster)")
        print(f"{'layer':30} {'eager µs':>9} " + " ".join(f"{n:>16}" for n in kernels))
        ratios: dict[str, list[float]] = {n: [] for n in kernels}
        for s in spec.shape_set(args.set):
            inputs = spec.make_inputs(s, "float32", 0, "cpu")
            out = torch.empty(spec.out_shape(s))
            eager = timed(partial(spec.vendor(), *inputs), args.calls)
            cells = []
            for name, kernel in kernels.items():
                t = timed(kernel.bind(out, inputs, {}), args.calls)
                ratios[name].append(eager / t)
                cells.append(f"{t * 1e6:8.0f} µs {eager / t:4.2f}x")
            print(f"{label(s):30} {eager * 1e6:9.0f} " + " ".join(f"{c:>16}" for c in cells))
        print(f"{'geomean':30} {'':9} " + " ".join(
            f"{statistics.geometric_mean(r):15.2f}x" for r in ratios.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
