"""`-B lab` against llama.cpp on the same GGUF, same threads, side by side in one run.

Prints:
  1. for each model (default: synthetic smollm2-135m at q8_0 and q4_0, both larger than a
     typical last-level cache, and llama-3.2-1b at Q4_K_M and Q6_K, the K-quant mixes
     people download), decode t/s (tg) and prefill t/s (pp) of lab and llama.cpp,
     their ratios, and η of each against this host's roofline — from one `strata bench` run
     with both backends (the usual repetitions, busy-host monitor and explanation);
  2. per op, the share of a lab decode step's wall time (the step as -B lab runs it,
     through strata's runner; each op's time from a second, profiled pass that times it
     around its call) and what is left over (the glue, the Python between the runner's
     stretches), so the next kernel to write is obvious;
  3. for files with Q4_K/Q6_K matrices, the same profile with those weights left in the
     file's layout (what -B lab ran before it repacked them into strata's x8 layout at
     load): which layout won, measured in one run.

With --paired R (the figure to quote on a shared host): instead of (1), both backends are
loaded side by side in this process and called in R alternating rounds (llama.cpp then lab,
then lab then llama.cpp, ...: a burst of load from other processes hits both), each round
one pp<p> + tg<n> request per backend; the ratio is taken per round and the median and
spread of the R ratios are printed. (1) runs each backend's repetitions one after the other,
so a burst of load skews one side: its ratio moved ±15% between runs on the 2-core host.

Usage:  .venv/bin/python benchmarks/lab_vs_llamacpp.py [--models M1,M2 | --archs] [-t THREADS]
        [-p 64] [-n 32] [--profile-tokens 16] [--paired 12]
Uses a temporary STRATA_HOME (kernels verified there first, roofline measured there once),
never the user's DB. `strata kernels bench linear_q8_0` etc. there would let dispatch choose
by speed; this script keeps dispatch's verified-first choice and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = ("synthetic:smollm2-135m@q8_0,synthetic:smollm2-135m@q4_0,"
          "synthetic:llama-3.2-1b@q4_k_m,synthetic:llama-3.2-1b@q6_k")
# --archs: one preset per architecture beyond llama (and Llama 3's RoPE factors), at q8_0 and
# at the Q4_K_M mix people download; sizes a 2-core host runs in minutes (Phi-3.5-mini, 3.8B,
# is left to --models)
ARCH_MODELS = ("synthetic:qwen3-0.6b@q8_0,synthetic:qwen3-0.6b@q4_k_m,"
               "synthetic:gemma-3-270m@q8_0,synthetic:gemma-3-1b@q8_0,"
               "synthetic:gemma-3-1b@q4_k_m,synthetic:llama-3.2-1b@q8_0")


def strata(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STRATA_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "strata.cli", *args], capture_output=True,
                          text=True, env=env)


def bench(model: str, threads: int, p: int, n: int, home: Path) -> list[dict]:
    r = strata("bench", model, "-B", "llamacpp,lab", "-p", str(p), "-n", str(n), "-t",
               str(threads), "--format", "json", home=home)
    if r.returncode != 0:
        sys.exit(f"strata bench failed: {r.stderr.strip()[-400:]}")
    return json.loads(r.stdout)


def side_by_side(model: str, rows: list[dict]) -> None:
    by = {(r["backend"], "tg" if r["n_gen"] else "pp"): r for r in rows}
    print(f"\n{model}")
    print(f"  {'test':<6}{'llama.cpp t/s':>15}{'lab t/s':>11}{'lab/llama.cpp':>15}"
          f"{'η llama.cpp':>13}{'η lab':>8}")
    for test in ("pp", "tg"):
        lc, lab = by.get(("llamacpp", test)), by.get(("lab", test))
        if not (lc and lab):
            continue
        ratio = lab["avg_ts"] / lc["avg_ts"]
        print(f"  {test:<6}{lc['avg_ts']:>15.2f}{lab['avg_ts']:>11.2f}{ratio:>15.2f}"
              f"{_eta(lc):>13}{_eta(lab):>8}")
    busy = [r.get("notes") for r in rows if "busy" in json.dumps(r.get("notes", ""))]
    if busy:
        print("  note: the host was busy during some tests (see strata bench's notes)")


def paired(model: str, threads: int, p: int, n: int, rounds: int, home: Path) -> None:
    """Both backends loaded at once, called in alternating rounds; per-round ratios."""
    os.environ["STRATA_HOME"] = str(home)
    import random
    import statistics

    from strata.backends import create
    from strata.backends.base import LoadConfig, RunRequest
    from strata.bench.metrics import compute
    from strata.models.source import resolve

    resolved = resolve(model)
    config = LoadConfig(threads=threads, n_ctx=p + n + 16)
    backends = {}
    for name in ("llamacpp", "lab"):
        backends[name] = create(name)
        backends[name].load(resolved, config)
    rng = random.Random(0)
    ratios: dict[str, list[float]] = {"pp": [], "tg": []}
    speeds: dict[tuple[str, str], list[float]] = {}
    try:
        for r in range(rounds + 1):  # round 0 warms both up, untimed
            prompt = tuple(backends["llamacpp"].random_tokens(p, seed=rng.randrange(1 << 30)))
            order = ("llamacpp", "lab") if r % 2 else ("lab", "llamacpp")
            got = {}
            for name in order:
                trace = backends[name].run(RunRequest((), prompt, n))
                got[name] = compute(trace)
            if r == 0:
                continue
            for test, attr in (("pp", "prefill_tps"), ("tg", "decode_tps")):
                lc, lab = getattr(got["llamacpp"], attr), getattr(got["lab"], attr)
                ratios[test].append(lab / lc)
                speeds.setdefault((test, "llamacpp"), []).append(lc)
                speeds.setdefault((test, "lab"), []).append(lab)
    finally:
        for b in backends.values():
            b.close()
    print(f"\n{model}: paired, {rounds} alternating rounds of pp{p} + tg{n}, {threads} "
          "thread(s)")
    print(f"  {'test':<6}{'llama.cpp t/s':>15}{'lab t/s':>11}{'lab/llama.cpp':>15}"
          f"{'ratio range':>17}")
    for test in ("pp", "tg"):
        rs = sorted(ratios[test])
        lc = statistics.median(speeds[(test, "llamacpp")])
        lab = statistics.median(speeds[(test, "lab")])
        print(f"  {test:<6}{lc:>15.2f}{lab:>11.2f}{statistics.median(rs):>15.2f}"
              f"{rs[0]:>9.2f}-{rs[-1]:.2f}")


def _eta(row: dict) -> str:
    return f"{row['eta']:.2f}" if row.get("eta") is not None else "-"


def profile(model: str, threads: int, tokens: int, home: Path, repack: bool = True) -> bool:
    """Print the profile; whether any weight was repacked into the x8 layout. repack=False:
    every weight in the file's layout (the file-layout kernels)."""
    os.environ["STRATA_HOME"] = str(home)
    import torch

    import strata.lab
    from strata.backends.base import LoadConfig
    from strata.engine.ops_lab import LabOps
    from strata.lab.plan import X8_OPS
    from strata.models.source import resolve

    path = resolve(model).path("gguf", "lab")
    chosen = LabOps.repacks
    if not repack:
        LabOps.repacks = lambda self, kind: False  # type: ignore[method-assign]
    try:
        # -B lab's K/V cache (llama.cpp's default f16), as the paired rounds run it
        m = strata.lab.load(path, "cpu", n_ctx=2 * tokens + 8, threads=threads,
                            kv=LoadConfig().kv_type)
    finally:
        LabOps.repacks = chosen  # type: ignore[method-assign]
    with torch.inference_mode():
        m.prefill([1, 2, 3, 4])
        m.decode(5)  # warm
        t0 = time.perf_counter()  # as -B lab runs: the runner, nothing timed inside
        for i in range(tokens):
            m.decode(6 + i)
        wall = time.perf_counter() - t0
        m.kernels.profile = True  # then each kernel timed on its own, from Python
        t0 = time.perf_counter()
        for i in range(tokens):
            m.decode(6 + tokens + i)
        profiled = time.perf_counter() - t0
    served = m.kernels.served()
    layout = "x8 layout" if repack else "file layout"
    print(f"\nprofile of a decode step, {model} ({layout}), {threads} thread(s), {tokens} "
          f"tokens: {wall / tokens * 1e3:.2f} ms/token (each op timed from Python: "
          f"{profiled / tokens * 1e3:.2f})")
    print(f"  {'op':<18}{'impl':<12}{'ms/token':>10}{'share':>8}")
    for op, s in m.kernels.seconds.most_common():
        print(f"  {op:<18}{served[op]['impl'] or '-':<12}{s / tokens * 1e3:>10.3f}"
              f"{s / wall:>8.1%}")
    # what the runner's step takes beyond the kernels' own times (glue in C and in torch,
    # Python between stretches); negative within the noise when there is next to none
    glue = wall - sum(m.kernels.seconds.values())
    print(f"  {'glue + machinery':<18}{'':<12}{glue / tokens * 1e3:>10.3f}{glue / wall:>8.1%}")
    return any(getattr(w, "kind", "") in X8_OPS for w in m.held.values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=MODELS)
    ap.add_argument("--archs", action="store_true",
                    help=f"the architectures' presets instead: {ARCH_MODELS}")
    ap.add_argument("-t", "--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("-p", type=int, default=64)
    ap.add_argument("-n", type=int, default=32)
    ap.add_argument("--profile-tokens", type=int, default=16)
    ap.add_argument("--paired", type=int, default=0, metavar="ROUNDS",
                    help="alternate the two backends in one process for ROUNDS rounds and "
                         "print the median per-round ratio (instead of strata bench)")
    args = ap.parse_args()
    if args.paired < 0:
        ap.error(f"--paired {args.paired}: a number of rounds (0: strata bench instead)")
    if args.archs:
        args.models = ARCH_MODELS
    with tempfile.TemporaryDirectory(prefix="strata-labbench-") as tmp:
        home = Path(tmp)
        print(f"host: {os.cpu_count()} CPUs; threads {args.threads}; STRATA_HOME {home}")
        for model in args.models.split(","):
            if args.paired:
                paired(model, args.threads, args.p, args.n, args.paired, home)
            else:
                side_by_side(model, bench(model, args.threads, args.p, args.n, home))
        for model in args.models.split(","):
            if profile(model, args.threads, args.profile_tokens, home):
                profile(model, args.threads, args.profile_tokens, home, repack=False)


if __name__ == "__main__":
    main()
