"""Regenerate benchmarks/transcripts/standins.jsonl: recorded `strata kernels eval` attempts
of three pretend models whose replies are HAND-WRITTEN STAND-INS, not model output.

No language model is reachable where these were made. The replies below were written by
hand to exercise the loop the way models are seen to behave; the lab's verdicts on them
(static and link checks, sandboxed verification) are real and made on the host that runs
this script. The three stand-ins:

  standin-fixes-compile    turn 1 does not compile, turn 2 (after the compiler's lines) is
                           right;
  standin-cheats           submits kernels from tests/fixtures/kernels/adversarial/ (sandbox
                           escapes, tampering, constant output) and replies without code;
  standin-wrong-then-right turn 1 has the wrong numbers; sample 1 is right on turn 2,
                           sample 2 once more wrong and right on turn 3.

How: a real loopback OpenAI-compatible server (tests/replay_server.py) answers by model name
and by the request's per-turn seed (seed = 1000 * sample + turn, the loop's rule), so the
replay is deterministic whatever order the concurrent samples arrive in; the real CLI runs
`strata kernels eval` against it in a temporary STRATA_HOME seeded with tests/seed_host,
then `strata kernels attempts --export` writes the file.

    python benchmarks/transcripts/make_transcripts.py [--out FILE] [--samples 2] [--turns 3]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
ADVERSARIAL = ROOT / "tests" / "fixtures" / "kernels" / "adversarial"
OPS = ("rmsnorm", "silu_mul", "softmax")
MODELS = ("standin-fixes-compile", "standin-cheats", "standin-wrong-then-right")
HEAD = "// strata-kernel: op={op} dialect=c entry=strata_{op}\n#include <math.h>\n" \
       "#include <stdint.h>\n\n"

# -- hand-written kernels: right, not compiling, wrong -----------------------------------------

RMSNORM = """void strata_rmsnorm(float *out, const float *x, const float *w, int64_t rows,
                    int64_t cols, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * cols;
        double even = 0.0, odd = 0.0;  /* two accumulators, summed in double */
        int64_t c = 0;
        for (; c + 1 < cols; c += 2) {
            even += (double)row[c] * row[c];
            odd += (double)row[c + 1] * row[c + 1];
        }
        if (c < cols) even += (double)row[c] * row[c];
        double scale = 1.0 / sqrt((even + odd) / (double)cols + (double)eps);
        for (c = 0; c < cols; c++) out[r * cols + c] = (float)(row[c] * scale * w[c]);
    }
}
"""
SILU_MUL = """void strata_silu_mul(float *out, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double v = a[i];
        double gate = v / (1.0 + exp(-v));  /* exp overflows to inf: v / inf = -0 */
        out[i] = (float)(gate * (double)b[i]);
    }
}
"""
SOFTMAX = """void strata_softmax(float *out, const float *x, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * cols;
        float *dst = out + r * cols;
        float top = row[0];
        for (int64_t c = 1; c < cols; c++) top = row[c] > top ? row[c] : top;
        double total = 0.0;
        for (int64_t c = 0; c < cols; c++) total += exp((double)row[c] - top);
        for (int64_t c = 0; c < cols; c++)
            dst[c] = (float)(exp((double)row[c] - top) / total);
    }
}
"""
RIGHT = {"rmsnorm": RMSNORM, "silu_mul": SILU_MUL, "softmax": SOFTMAX}
# (old, new) edits that break a right kernel: an undeclared name (compile), wrong numbers
BREAK = {"rmsnorm": ("/ (double)cols + (double)eps", "/ (double)ncols + (double)eps"),
         "silu_mul": ("(float)(gate * (double)b[i])", "(float)(gate * (double)bb[i])"),
         "softmax": ("dst[c] = (float)", "dst[c] = (flaot)")}
WRONG = {  # two different mistakes per op
    "rmsnorm": [("* scale * w[c]", "* scale"), ("/ (double)cols + (double)eps", "+ eps")],
    "silu_mul": [("double gate = v / (1.0 + exp(-v));", "double gate = v;"),
                 ("double gate = v / (1.0 + exp(-v));", "double gate = 1.0 / (1.0 + exp(-v));")],
    "softmax": [("/ total", ""), ("/ total", "/ (double)cols")],
}
# cheats per op and sample (the fixture files as replies); None: a reply without code
CHEATS: dict[str, list[list[str | None]]] = {
    "rmsnorm": [["declares_cpython.c", "data_race.c", "first_seed_only.c"],
                ["first_seed_only.c", None, "declares_cpython.c"]],
    "silu_mul": [["declares_libc.c", "raw_syscall.c", "reads_output.c"],
                 ["writes_inputs.c", "writes_past_end.c", "cached_output.c"]],
    "softmax": [["constant_fill.c", None, "constant_fill.c"],
                [None, "constant_fill.c", None]],
}


def kernel(op: str, edit: tuple[str, str] | None = None) -> str:
    body = RIGHT[op]
    if edit is not None:
        assert edit[0] in body, (op, edit)
        body = body.replace(edit[0], edit[1])
    return HEAD.format(op=op) + body


def fenced(code: str, prose: str) -> str:
    return f"{prose}\n\n```c\n{code}```\n\nThe tail of every row is handled."


def fixes_compile(op: str, sample: int, turn: int) -> str:
    if turn == 1:
        return fenced(kernel(op, BREAK[op]), f"Here is a straightforward {op} kernel.")
    return fenced(kernel(op), "Sorry, I used an undeclared name. Fixed:")


def cheats(op: str, sample: int, turn: int) -> str:
    plan = CHEATS[op][sample % len(CHEATS[op])]
    name = plan[(turn - 1) % len(plan)]
    if name is None:
        return "Optimised kernels for this op are best taken from a vendor library; I will " \
               "not write one from scratch."
    return fenced((ADVERSARIAL / name).read_text(), "A highly optimised kernel:")


def wrong_then_right(op: str, sample: int, turn: int) -> str:
    right_on = 2 + sample % 2
    if turn >= right_on:
        return fenced(kernel(op), "Fixed after your mismatch report:")
    return fenced(kernel(op, WRONG[op][turn - 1]), f"A simple {op}:")


WRITERS = {"standin-fixes-compile": fixes_compile, "standin-cheats": cheats,
           "standin-wrong-then-right": wrong_then_right}


def op_of(request: dict[str, Any]) -> str:
    """The op the conversation is about, from the task's title line ("# Task: `op` ...")."""
    first = next(m["content"] for m in request["messages"] if m["role"] == "user")
    found = re.search(r"^# Task: `(\w+)`", first, re.MULTILINE)
    if found is None:
        raise ValueError("the request has no task title: did templates/task.md change?")
    return found.group(1)


def answer(request: dict[str, Any]) -> str:
    """The stand-in's reply: by model, op, and the loop's per-turn seed."""
    seed = int(request.get("seed") or 0)
    sample, turn = divmod(seed, 1000)
    return WRITERS[request["model"]](op_of(request), sample, turn)


def strata(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "STRATA_HOME": str(home), "COLUMNS": "160"}
    return subprocess.run([sys.executable, "-m", "strata.cli", *args], capture_output=True,
                          text=True, env=env, check=False)


def make(out: Path, samples: int, turns: int) -> subprocess.CompletedProcess[str]:
    sys.path.insert(0, str(ROOT))
    from tests.replay_server import replay_server
    from tests.seed_host import seed_host

    with tempfile.TemporaryDirectory(prefix="strata-transcripts-") as tmp:
        home = Path(tmp)
        seed_host(home)
        with replay_server(answer, models=list(MODELS)) as srv:
            proc = strata("kernels", "eval", "--endpoint", srv.url, "--models",
                          ",".join(MODELS), "--ops", ",".join(OPS), "--samples",
                          str(samples), "--turns", str(turns), "--no-bench", home=home)
        if proc.returncode != 0:
            raise SystemExit(f"kernels eval failed:\n{proc.stderr}")
        export = strata("kernels", "attempts", "--export", str(out), home=home)
        if export.returncode != 0:
            raise SystemExit(f"kernels attempts --export failed:\n{export.stderr}")
    return proc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=HERE / "standins.jsonl")
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--turns", type=int, default=3)
    args = ap.parse_args()
    proc = make(args.out.resolve(), args.samples, args.turns)
    print("hand-written stand-in replies, not model output; verdicts from this host")
    print(proc.stdout)
    print(f"wrote {args.out} ({len(args.out.read_text().splitlines())} attempts)")


if __name__ == "__main__":
    main()
