"""Harness overhead of the llamacpp backend: strata's t/s vs llama.cpp's own counters.

  python benchmarks/llamacpp_overhead.py [--model synthetic:smollm2-135m@q8_0]
                                          [-p 512] [-n 128] [-r 5] [-t THREADS]

For the same runs, prefill t/s and decode t/s from strata's perf_counter_ns timestamps
(request start -> prompt synchronised; prompt end -> last token synchronised) against
llama.cpp's internal llama_perf_context counters (t_p_eval_ms / t_eval_ms, which time only
the inside of llama_decode + llama_synchronize). ratio = strata t/s / llama.cpp t/s: 1.0
means no harness overhead; target >= 0.97. One untimed warm-up run per test first.
Prints; asserts nothing (speed goals are benchmarks, not tests).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from strata.backends.base import LoadConfig, RunRequest, RunTrace
from strata.backends.llamacpp import LlamaCppBackend
from strata.models.source import resolve

TARGET = 0.97


def make_request(b: LlamaCppBackend, n_prompt: int, n_gen: int, seed: int) -> RunRequest:
    bos = b.bos()
    head = [bos] if (n_prompt and bos is not None) else []
    return RunRequest((), tuple(head + b.random_tokens(n_prompt - len(head), seed)), n_gen)


def pp_pair(t: RunTrace) -> tuple[float, float]:
    assert t.t_prefill_end is not None
    ours = t.n_prompt / ((t.t_prefill_end - t.t_start) / 1e9)
    theirs = t.internal["n_p_eval"] / (t.internal["t_p_eval_ms"] / 1e3)
    return ours, theirs


def tg_pair(t: RunTrace) -> tuple[float, float]:
    start = t.t_prefill_end if t.t_prefill_end is not None else t.t_start
    ours = len(t.token_ns) / ((t.token_ns[-1] - start) / 1e9)
    theirs = t.internal["n_eval"] / (t.internal["t_eval_ms"] / 1e3)
    return ours, theirs


def measure(b: LlamaCppBackend, name: str, req_args: tuple[int, int], reps: int,
            pair: object) -> list[float]:
    print(f"\n{name}: run  strata t/s  llama.cpp t/s  ratio")
    b.run(make_request(b, *req_args, seed=10_000))  # warm-up, not recorded
    ratios = []
    for r in range(reps):
        trace = b.run(make_request(b, *req_args, seed=r))
        ours, theirs = pair(trace)  # type: ignore[operator]
        ratios.append(ours / theirs)
        print(f"{name}: {r + 1:>3}  {ours:>10.2f}  {theirs:>13.2f}  {ratios[-1]:.4f}")
    mean = statistics.fmean(ratios)
    sd = statistics.stdev(ratios) if len(ratios) > 1 else 0.0
    verdict = "meets" if mean >= TARGET else "MISSES"
    print(f"{name}: mean ratio {mean:.4f} (sd {sd:.4f}, min {min(ratios):.4f}) {verdict} "
          f"the >= {TARGET} target")
    return ratios


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="synthetic:smollm2-135m@q8_0")
    ap.add_argument("-p", "--prompt", type=int, default=512)
    ap.add_argument("-n", "--gen", type=int, default=128)
    ap.add_argument("-r", "--reps", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=None)
    ap.add_argument("-ngl", "--n-gpu-layers", type=int, default=0)
    args = ap.parse_args()

    t0 = time.perf_counter()
    model = resolve(args.model)
    model.path("gguf", "llamacpp")
    b = LlamaCppBackend()
    b.load(model, LoadConfig(threads=args.threads, n_gpu_layers=args.n_gpu_layers))
    info = b.info()
    print(f"model {args.model}  llama-cpp-python {info['llama_cpp_python']}  threads "
          f"{info['threads']}  ngl {info['n_gpu_layers']}  (ready in "
          f"{time.perf_counter() - t0:.1f} s)")
    try:
        pp = measure(b, f"pp{args.prompt}", (args.prompt, 0), args.reps, pp_pair)
        tg = measure(b, f"tg{args.gen}", (0, args.gen), args.reps, tg_pair)
    finally:
        b.close()
    print(f"\nsummary: pp{args.prompt} mean ratio {statistics.fmean(pp):.4f}, "
          f"tg{args.gen} mean ratio {statistics.fmean(tg):.4f} (target >= {TARGET})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
