"""Decode bandwidth of the lab's quantised linear layers (ggml numerics) on this host.

  python benchmarks/lab_linear_q.py [--max-time 1.0] [--prefill 64] [--impl avx2]
                                    [--kinds q8_0,q4_0,q4_K,q6_K] [--x8-impl avx512vnni]
                                    [--shape N,K]

At B = 1 (one decode token) `linear_q8_0`/`linear_q4_0` stream their weights once, so the
figure that matters is GB/s over the weight bytes, at a size far beyond the last-level cache
(q8_0: N = K = 8192, 71 MB; q4_0: N = 16384, K = 8192, 75 MB; mxfp4 at gpt-oss-20b's
expert shape, N = K = 2880, 4.4 MB: a decode step reads a few such matrices per layer, each
cold). --shape N,K times every kind at one shape (e.g. q4_0 next to mxfp4 at 2880,2880).
Measured side by side in one run, every call cold (a buffer >= 2x the LLC touched before
each call, kernels.timing):

  - the kernel (compiled with strata.native, called through ctypes: no sandbox, no torch);
  - the old `matvec_<kind>` kernel (fp32 activations) on the same weights;
  - a cold read of the same bytes: a plain C loop summing the buffer as 64-bit words,
    OpenMP over the same threads, same flush, same timer;
  (the weights live in memory allocated as STREAM's arrays are: numpy, which asks for
  transparent huge pages; torch's allocator does not, which costs ~20% here for everyone)
  - STREAM (C copy/triad/read over arrays >= 4x the LLC), measured now, and the roofline
    stored for this host, if any.

Targets (issue 14): kernel >= 0.85 of the cold read and >= 0.7 of STREAM. With --prefill B,
the same weights at B rows of x are timed too (GOP/s: compute-bound, no target). Prints;
asserts nothing. The figures are only as quiet as the host: on a shared machine other
work skews them, so the contenders are called interleaved (the same bursts of load hit
each) and both the median and the best call are printed.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
import textwrap
from pathlib import Path

SOURCES = Path(__file__).resolve().parent.parent / "src/strata/kernels/sources/c"
# (N, K): weights >> a 32 MiB L3; mxfp4: gpt-oss-20b's expert matrix (hidden 2880)
SHAPES = {"q8_0": (8192, 8192), "q4_0": (16384, 8192), "q4_K": (16384, 8192),
          "q6_K": (12288, 8192), "q5_0": (16384, 8192), "mxfp4": (2880, 2880)}
READ_SOURCE = textwrap.dedent("""\
    #include <stdint.h>
    /* The cold-read yardstick: every byte of the buffer read once (as 64-bit words) over
       the default OpenMP team, in contiguous chunks handed out dynamically as the kernels'
       rows are (on a shared host a static split waits for the slowest core). */
    uint64_t strata_read_bytes(const uint8_t *p, int64_t n) {
        const uint64_t *w = (const uint64_t *)p;
        const int64_t words = n / 8;
        uint64_t s = 0;
    #pragma omp parallel for schedule(dynamic, 32768) reduction(+:s)
        for (int64_t i = 0; i < words; i++) s += w[i];
        for (int64_t i = words * 8; i < n; i++) s += p[i];
        return s;
    }
    """)


def _lib(path: Path) -> ctypes.CDLL:
    """A kernel built as the lab builds it (its ISA flags and its shared headers' digest in
    the build key: a header change rebuilds it); the plain C reader as it is."""
    from strata.native import load_shared

    if path.parent != SOURCES:
        return load_shared(path)
    from strata.kernels.dialects.c import build_c
    from strata.kernels.impl import from_source

    return ctypes.CDLL(str(build_c(from_source(path))))


def _caller(fn, ptrs: tuple[int, ...], sizes: tuple[int, ...]):
    """A thunk calling `fn(*pointers, *int64 sizes)`, its ctypes arguments built now."""
    c_args = [ctypes.c_void_p(a) for a in ptrs] + [ctypes.c_int64(a) for a in sizes]
    return lambda: fn(*c_args)


def _interleaved(fns: dict, flush, max_time_s: float) -> dict[str, tuple[float, float]]:
    """{name: (median, best) seconds per call}: rounds in which every contender is called
    once after a cache flush, the order rotating, until each has run ~max_time_s (at least
    7 rounds). Interleaving puts every contender through the same bursts of other load."""
    import statistics
    import time

    names = list(fns)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for fn in fns.values():  # warm-up: page faults, lazy binding, OpenMP team start
        flush()
        fn()
    spent, rnd = 0.0, 0
    while rnd < 7 or spent < max_time_s:
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:
            flush()
            t0 = time.perf_counter()
            fns[name]()
            samples[name].append(time.perf_counter() - t0)
        spent += max(v[-1] for v in samples.values())
        rnd += 1
    return {name: (statistics.median(v), min(v)) for name, v in samples.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-time", type=float, default=1.0, help="timed seconds per contender")
    ap.add_argument("--prefill", type=int, default=0, help="also time B rows of x (GOP/s)")
    ap.add_argument("--impl", default="avx2", help="variant of the C kernels (avx2, naive)")
    ap.add_argument("--x8-impl", default=None,
                    help="variant of the x8-layout kernels (default: --impl; avx512vnni)")
    ap.add_argument("--kinds", default="q8_0,q4_0,q4_K,q6_K")
    ap.add_argument("--shape", default=None,
                    help="N,K for every kind (default: each kind's own, SHAPES)")
    args = ap.parse_args()
    for kind in args.kinds.split(","):
        if kind not in SHAPES:
            ap.error(f"--kinds {args.kinds}: choose from {', '.join(SHAPES)}")
    shape = None
    if args.shape:
        try:
            shape = tuple(int(v) for v in args.shape.split(","))
        except ValueError:
            shape = ()
        block = 256 if any(kind.endswith("_K") for kind in args.kinds.split(",")) else 32
        if len(shape) != 2 or min(shape) < 1 or shape[1] % block:
            ap.error(f"--shape {args.shape}: N,K with K a multiple of {block} (the blocks of "
                     f"--kinds {args.kinds})")
    for impl in {args.impl, args.x8_impl or args.impl}:
        if not list(SOURCES.glob(f"*.{impl}.c")):
            ap.error(f"no C kernels of variant {impl!r} (e.g. avx2, naive, avx512vnni)")
    import torch

    from strata.hardware.microbench import MeasureConfig, measure_cpu_bandwidth
    from strata.host import _profile
    from strata.kernels.bench import MIN_FLUSH_BYTES
    from strata.kernels.ops import _kquant, _kquant_x8, _linear_q, _quant
    from strata.kernels.timing import flusher

    profile = _profile()
    cpu = profile.cpu
    llc = cpu.last_level_cache_bytes() or (32 << 20)
    flush = flusher("cpu", max(MIN_FLUSH_BYTES, 2 * llc))
    threads = torch.get_num_threads()
    print(f"host: {cpu.model}, {cpu.physical_cores} cores, LLC {llc >> 20} MiB; OpenMP "
          f"threads {os.environ.get('OMP_NUM_THREADS', 'default')}; a shared host skews "
          "every figure (other processes' load is not controlled)")
    stream, note = measure_cpu_bandwidth(cpu, MeasureConfig.default())
    stream_gbs = {k: f.value for k, f in stream.items()}
    print("STREAM now: " + ", ".join(f"{k} {v:.1f} GB/s" for k, v in stream_gbs.items())
          + (f" ({note})" if note else ""))
    stored = _stored_stream()
    if stored:
        print(f"STREAM stored for this host: {stored:.1f} GB/s (best of copy/triad/read)")
    best_stream = max(stream_gbs.values())

    with tempfile.TemporaryDirectory() as tmp:
        read_src = Path(tmp) / "read_bytes.c"
        read_src.write_text(READ_SOURCE)
        reader = _lib(read_src)
    reader.strata_read_bytes.restype = ctypes.c_uint64
    rows = []
    for kind in args.kinds.split(","):
        n, k = shape or SHAPES[kind]
        blocks = _kquant if kind in _kquant.BLOCK_BYTES else _quant
        w = _like_stream(blocks.random_blocks(kind, n, k, seed=0))
        nbytes = w.numel()
        x = _linear_q.plant_blocks(torch.randn(max(1, args.prefill), k), 0)
        out = torch.empty(x.shape[0], n)
        lin = _lib(SOURCES / f"linear_{kind}.{args.impl}.c")
        wp, op = w.data_ptr(), out.data_ptr()

        xp = x.data_ptr()
        linears = {f"linear_{kind}": (lin[f"strata_linear_{kind}"], (op, xp, wp))}
        # the other layout of the same weights: strata's x8 (what -B lab runs), or the old
        # fp32-activation matvec
        if kind in _kquant_x8.KINDS:
            w8 = _like_stream(_kquant_x8.pack(kind, w, k))
            x8 = _lib(SOURCES / f"linear_{kind}x8.{args.x8_impl or args.impl}.c")
            linears[f"linear_{kind}x8"] = (x8[f"strata_linear_{kind}x8"],
                                           (op, xp, w8.data_ptr()))
        contenders = {name: _caller(fn, ptrs, (1, n, k)) for name, (fn, ptrs) in linears.items()}
        if (SOURCES / f"matvec_{kind}.{args.impl}.c").exists():  # q8_0 and q4_0 have one
            old = _lib(SOURCES / f"matvec_{kind}.{args.impl}.c")
            contenders[f"matvec_{kind} (fp32 x)"] = _caller(old[f"strata_matvec_{kind}"],
                                                            (op, wp, xp), (1, n, k))
        contenders["cold read (C)"] = _caller(reader.strata_read_bytes, (wp,), (nbytes,))
        times = _interleaved(contenders, flush, args.max_time)
        read = times["cold read (C)"]
        print(f"\n{kind}: N={n} K={k}, weights {nbytes / 1e6:.1f} MB, B=1, cold; "
              "median (best) over interleaved calls")
        print(f"{'contender':24} {'ms':>15} {'GB/s':>15} {'/ read':>13} {'/ STREAM':>13}")
        for name, (med, best) in times.items():
            print(f"{name:24} {med * 1e3:7.2f} ({best * 1e3:5.2f}) "
                  f"{nbytes / med / 1e9:7.1f} ({nbytes / best / 1e9:5.1f}) "
                  f"{read[0] / med:5.2f} ({read[1] / best:5.2f}) "
                  f"{nbytes / med / 1e9 / best_stream:5.2f} "
                  f"({nbytes / best / 1e9 / best_stream:5.2f})")
        for name in (c for c in contenders if c.startswith("linear_")):
            med, best = times[name]
            rows.append((name, read[0] / med, read[1] / best, nbytes / med / 1e9 / best_stream,
                         nbytes / best / 1e9 / best_stream))
        if args.prefill > 1:
            b = args.prefill
            pre = {name: _caller(fn, ptrs, (b, n, k)) for name, (fn, ptrs) in linears.items()}
            print(f"prefill B={b} (median over interleaved calls):")
            for name, (med, _best) in _interleaved(pre, flush, args.max_time).items():
                print(f"{name:24} {med * 1e3:8.2f} ms {2 * b * n * k / med / 1e9:8.1f} GOP/s")
    print(f"\nsummary (threads {threads}; targets: >= 0.85 of the cold read, >= 0.70 of "
          f"STREAM {best_stream:.1f} GB/s):")
    for name, vs_read, vs_read_best, vs_stream, vs_stream_best in rows:
        ok = "ok" if vs_read >= 0.85 and vs_stream >= 0.7 else "MISS"
        print(f"{name}: {vs_read:.2f} of the cold read (best: {vs_read_best:.2f}), "
              f"{vs_stream:.2f} of STREAM (best: {vs_stream_best:.2f})  {ok} (medians)")
    return 0


def _like_stream(t):
    """A copy of `t` in memory allocated as STREAM's arrays are (numpy: on Linux large arrays
    are advised to use transparent huge pages; torch's allocator does not ask), so the
    kernels, the cold read and STREAM all read the same kind of pages."""
    import numpy as np
    import torch

    a = np.empty(tuple(t.shape), dtype=np.uint8)
    a[...] = t.numpy()
    return torch.from_numpy(a)


def _stored_stream() -> float | None:
    """The best on-device stream rate of the roofline stored for this host, if any."""
    from strata.host import this_host
    from strata.measure.roofline import Roofline
    from strata.paths import default_db_path
    from strata.store import open_db
    from strata.store.hosts import latest_measurement

    path = default_db_path()
    if not path.exists():
        return None
    conn = open_db(path)
    stored = latest_measurement(conn, this_host(conn).fingerprint, "roofline")
    if not stored:
        return None
    cpu = Roofline.from_dict(stored).device("cpu")
    return cpu.peak_bandwidth_gbs() if cpu else None


if __name__ == "__main__":
    sys.exit(main())
