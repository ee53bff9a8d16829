"""Figures for `strata kernels generate / eval` and `strata skills eval`, measured side by
side in one run on this host. No language model is reachable here: every reply is a
HAND-WRITTEN STAND-IN served by a real loopback OpenAI-compatible server
(tests/replay_server.py); the lab's verdicts on them are real.

  python benchmarks/kernels_generate_loop.py [--reps 3] [--candidates 6] [--replay-bench]
                                             [--parts 1,2,3,4]

1. Loop overhead per turn, model latency excluded: prompt build, extraction, candidate file,
   static check, build + link check, sandboxed verification and the benchmark at the `llm`
   shapes, each timed on its own (distinct candidates: no verdict or build cache helps);
   then three whole turns of `generate` (compile error, mismatch, correct) through the
   replay server, with the judge's share of each turn.
2. Verification throughput: candidates per minute, distinct candidates, jobs = 1 and jobs =
   this machine's cores.
3. `strata kernels eval --replay benchmarks/transcripts/standins.jsonl` (recorded by
   benchmarks/transcripts/make_transcripts.py): the leaderboard, re-scored here offline.
   --no-bench unless --replay-bench (each correct candidate's benchmark costs part 1's bench
   time).
4. `strata skills eval builtin:c` on the held-out op layernorm against a stand-in student
   that writes a right kernel whenever the skill is in its system prompt, and without it a
   right one only in sample 1 (the others divide the variance by cols - 1).

Everything runs in a temporary STRATA_HOME seeded by tests/seed_host.seed_host (this host's
record and a seeded roofline of round, huge peaks: roofline shares printed here mean nothing);
the user's DB is never touched. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
TRANSCRIPTS = ROOT / "benchmarks" / "transcripts"
sys.path[:0] = [str(ROOT), str(TRANSCRIPTS)]

import make_transcripts as mt  # noqa: E402  (benchmarks/transcripts: the stand-in replies)

OP = "rmsnorm"
LAYERNORM = """void strata_layernorm(float *out, const float *x, const float *w, const float *b,
                      int64_t rows, int64_t cols, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * cols;
        double mean = 0.0, var = 0.0;
        for (int64_t c = 0; c < cols; c++) mean += row[c];
        mean /= (double)cols;
        for (int64_t c = 0; c < cols; c++) var += ((double)row[c] - mean) * (row[c] - mean);
        var /= (double)cols;
        double inv = 1.0 / sqrt(var + (double)eps);
        for (int64_t c = 0; c < cols; c++)
            out[r * cols + c] = (float)(((double)row[c] - mean) * inv * w[c] + b[c]);
    }
}
"""


def banner(text: str) -> None:
    print(f"\n== {text} " + "=" * max(0, 86 - len(text)), flush=True)


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    value = fn()
    return time.perf_counter() - t0, value


def distinct(code: str, tag: str) -> str:
    """The same kernel under a new content hash (new build, no cached verdict)."""
    return f"{code}/* candidate {tag} */\n"


def strata(*args: str, home: Path) -> tuple[float, subprocess.CompletedProcess[str]]:
    env = {**os.environ, "STRATA_HOME": str(home), "COLUMNS": "240"}
    return timed(lambda: subprocess.run([sys.executable, "-m", "strata.cli", *args],
                                        capture_output=True, text=True, env=env, check=False))


def fmt_s(xs: list[float]) -> str:
    if len(xs) == 1:
        return f"{xs[0] * 1e3:10.1f} ms  (n=1)"
    return (f"{statistics.median(xs) * 1e3:10.1f} ms  (median of {len(xs)}; "
            f"{min(xs) * 1e3:.1f}-{max(xs) * 1e3:.1f})")


# -- 1. loop overhead per turn ----------------------------------------------------------------

def stage_times(s: Any, roof: Any, reps: int, bench: bool) -> None:
    from strata.commands.kernels import add_external, run_bench, run_verify
    from strata.kernels.dialects.base import prepared
    from strata.kernels.gen.extract import extract_code
    from strata.kernels.gen.judge import write_candidate
    from strata.kernels.gen.prompt import build_prompt
    from strata.kernels.verify import static_verdict

    rows: dict[str, list[float]] = {k: [] for k in (
        "prompt build (first turn)", "extraction", "candidate file + declaration",
        "static check", "build + link check (gcc, ELF)", "sandboxed verification")}
    impl = None
    for _ in range(reps):
        dt, prompt = timed(lambda: build_prompt(s, OP, "c", "cpu", roof))
        rows["prompt build (first turn)"].append(dt)
        text = mt.fenced(distinct(mt.kernel(OP), uuid.uuid4().hex), "Here it is.")
        dt, got = timed(lambda t=text: extract_code(t, OP, "c", f"strata_{OP}"))
        rows["extraction"].append(dt)
        dt, impl = timed(lambda c=got.code: add_external(s, write_candidate(OP, "c", c)))
        rows["candidate file + declaration"].append(dt)
        dt, refused = timed(lambda m=impl: static_verdict(m))
        rows["static check"].append(dt)
        dt, _ = timed(lambda m=impl: prepared(m, s.caps))
        rows["build + link check (gcc, ELF)"].append(dt)
        dt, verdicts = timed(lambda m=impl: run_verify(s, [m], force=False, timeout_s=120.0,
                                                       progress=lambda _m: None, jobs=1))
        rows["sandboxed verification"].append(dt)
        assert refused is None and verdicts[0].passed, verdicts[0].message
    print(f"prompt: {len(prompt.messages[0]['content']) + len(prompt.messages[1]['content']):,}"
          f" characters (system + task), template {prompt.template_hash}")
    for name, xs in rows.items():
        print(f"  {name:<44}{fmt_s(xs)}")
    if bench and impl is not None:
        dt, figures = timed(lambda: run_bench(s, [impl], roof, shapes="llm", compile_=False,
                                              max_time_s=0.2, progress=lambda _m: None))
        mine = [f for f in figures if f.impl == impl.name]
        print(f"  {'benchmark at the llm shapes (vs torch eager)':<44}{fmt_s([dt])}  "
              f"[{len(mine)} shapes; eager timed alongside; > 10x speedups re-timed]")
    else:
        print("  benchmark: skipped (--no-stage-bench)")
    print("  (verification re-runs the static check and finds the build cached: its figure is"
          " the sandbox)")


def whole_turns(s: Any) -> None:
    """Three turns of `generate` over HTTP: compile error, mismatch, correct (unbenched)."""
    from tests.replay_server import replay_server

    from strata.kernels.gen.chat import ChatClient
    from strata.kernels.gen.loop import GenConfig, generate

    tag = uuid.uuid4().hex
    script = [mt.fenced(distinct(mt.kernel(OP, mt.BREAK[OP]), tag), "First try."),
              mt.fenced(distinct(mt.kernel(OP, mt.WRONG[OP][0]), tag), "Second try."),
              mt.fenced(distinct(mt.kernel(OP), tag), "Third try.")]
    marks: list[tuple[int, str, float]] = []
    cfg = GenConfig(op=OP, dialect="c", device="cpu", model="replay-model", turns=3,
                    samples=1, register=False, bench=False, concurrency=1, jobs=1)
    with replay_server(script) as srv, ChatClient(srv.url) as client:
        t0 = time.perf_counter()
        result = generate(cfg, client, s.conn, None,
                          lambda _s, t, w: marks.append((t, w, time.perf_counter())))
        wall = time.perf_counter() - t0
    print("generate rmsnorm, 1 sample, 3 turns, --no-bench (loopback replay server):")
    for a in result.attempts:
        at = {w: x for t, w, x in marks if t == a.turn}
        judge = at[a.status] - at["judging"]
        http = at["judging"] - at["asking"]
        print(f"  turn {a.turn}: {a.status:<9} judge + store {judge * 1e3:8.1f} ms   request "
              f"{http * 1e3:6.1f} ms (loopback; a model's latency goes here)")
    latency = sum(a.latency_s or 0.0 for a in result.attempts)
    print(f"  whole run {wall:.2f} s (prompt build included) - requests {latency:.2f} s = "
          f"{(wall - latency) / len(result.attempts):.2f} s of lab per turn")


# -- 2. verification throughput ---------------------------------------------------------------

def throughput(s: Any, n: int) -> None:
    from strata.commands.kernels import add_external, run_verify
    from strata.kernels.gen.judge import write_candidate

    cores = os.cpu_count() or 1
    for jobs in dict.fromkeys((1, cores)):
        impls = [add_external(s, write_candidate(OP, "c", distinct(mt.kernel(OP),
                                                                    uuid.uuid4().hex)))
                 for _ in range(n)]
        dt, verdicts = timed(lambda i=impls, j=jobs: run_verify(
            s, i, force=False, timeout_s=120.0, progress=lambda _m: None, jobs=j))
        ok = sum(v.passed for v in verdicts)
        print(f"  jobs={jobs}: {n} distinct candidates (build + link check + sandbox) in "
              f"{dt:6.1f} s = {n / dt * 60:5.1f} candidates/min   ({ok}/{n} passed)")


# -- 3. replay of recorded transcripts --------------------------------------------------------

def replay(home: Path, path: Path, bench: bool) -> None:
    if not path.is_file():
        print(f"{path} missing: run python benchmarks/transcripts/make_transcripts.py")
        return
    n = len(path.read_text().splitlines())
    cmd = ["kernels", "eval", "--replay", str(path), "--bench" if bench else "--no-bench"]
    print(f"$ strata {' '.join(cmd[:3])} {path.relative_to(ROOT)} {cmd[-1]}   "
          f"({n} recorded attempts; hand-written stand-in replies, not model output)")
    dt, proc = strata(*cmd, home=home)
    print(proc.stdout.rstrip() or proc.stderr.rstrip())
    print("  tokens: the replay server's word counts (a stand-in for `usage`)")
    print(f"  re-scored offline in {dt:.1f} s ({n / dt * 60:.1f} attempts/min, "
          f"{'with' if bench else 'without'} benchmarks)")


# -- 4. skills A/B ----------------------------------------------------------------------------

def student(marker: str) -> Callable[[dict[str, Any]], str]:
    """A stand-in student: with the skill in its system prompt it writes a right layernorm;
    without it only sample 1 is right (the others divide the variance by cols - 1)."""
    right = "// strata-kernel: op=layernorm dialect=c entry=strata_layernorm\n" \
            "#include <math.h>\n#include <stdint.h>\n\n" + LAYERNORM
    wrong = right.replace("var /= (double)cols;", "var /= (double)(cols - 1);")

    def answer(request: dict[str, Any]) -> str:
        sample = int(request.get("seed") or 0) // 1000
        skilled = marker in request["messages"][0]["content"]
        return mt.fenced(right if skilled or sample == 0 else wrong, "LayerNorm:")
    return answer


def skills_ab(home: Path, samples: int) -> None:
    from tests.replay_server import replay_server

    from strata.kernels.skills import load_skill

    skill = load_skill("builtin:c")
    marker = next(line for line in skill.text.splitlines() if len(line) > 40)
    cmd = ["skills", "eval", "builtin:c", "--student", "URL", "--ops", "layernorm",
           "--samples", str(samples), "--turns", "1", "--no-bench"]
    print(f"$ strata {' '.join(cmd)}   (stand-in student, not a model)")
    with replay_server(student(marker), models=["standin-student"]) as srv:
        cmd[cmd.index("URL")] = srv.url
        dt, proc = strata(*cmd, home=home)
        sent = srv.requests
    print(proc.stdout.rstrip() or proc.stderr.rstrip())
    with_skill = sum(marker in r["messages"][0]["content"] for r in sent)
    print("  tokens: the replay server's word counts; fast_1 needs --bench (not timed here)")
    print(f"  {len(sent)} requests ({with_skill} with the skill in the system prompt) in "
          f"{dt:.1f} s")


# -- main ---------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each loop stage")
    ap.add_argument("--candidates", type=int, default=6, help="candidates per jobs setting")
    ap.add_argument("--transcripts", type=Path, default=TRANSCRIPTS / "standins.jsonl")
    ap.add_argument("--replay-bench", action="store_true",
                    help="benchmark correct candidates in the replay (minutes each batch)")
    ap.add_argument("--no-stage-bench", action="store_true", help="skip part 1's benchmark")
    ap.add_argument("--ab-samples", type=int, default=4)
    ap.add_argument("--parts", default="1,2,3,4", help="which parts to run, e.g. 3,4")
    args = ap.parse_args()
    parts = {p.strip() for p in args.parts.split(",")}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="strata-genbench-") as tmp:
        home = Path(tmp)
        os.environ["STRATA_HOME"] = str(home)  # before strata resolves any path
        from tests.seed_host import seed_host

        seed_host(home)
        from rich.console import Console

        from strata.commands.kernels import session
        from strata.store import open_db

        s = session(conn=open_db(home / "strata.db"))
        roof = s.host.roofline(Console(stderr=True))
        print("NO MODEL IS REACHABLE HERE: every reply below is a hand-written stand-in served "
              "by tests/replay_server.py;\nthe verdicts (static/link checks, sandbox, "
              "benchmark) are real, measured on this host.")
        print(f"host: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start; "
              f"STRATA_HOME {home} (seeded roofline)")
        if "1" in parts:
            banner("1. loop overhead per turn, model latency excluded")
            stage_times(s, roof, args.reps, not args.no_stage_bench)
            whole_turns(s)
        if "2" in parts:
            banner("2. verification throughput")
            throughput(s, args.candidates)
        s.conn.close()
        if "3" in parts:
            banner("3. kernels eval --replay on recorded transcripts")
            replay(home, args.transcripts.resolve(), args.replay_bench)
        if "4" in parts:
            banner("4. skills A/B (stand-in student)")
            skills_ab(home, args.ab_samples)
    print(f"\nwhole script {time.perf_counter() - start:.0f} s; load average "
          f"{os.getloadavg()[0]:.2f} at the end (other processes share this host)")
    print("With your own model: strata kernels eval --endpoint http://127.0.0.1:8080/v1 "
          "--ops rmsnorm,softmax (llama-server; Ollama: http://127.0.0.1:11434/v1)")


if __name__ == "__main__":
    main()
