"""Terminal and machine views of kernel generation: the attempts list, a generate run's
samples, the eval leaderboard and the skills A/B table. Each view has a record function
(one schema for every format), its md columns, and a rich table; md/json go through
`views.output.emit`. Also what those commands show while and after they work: a generate
run's status board, its closing lines on stderr, the built-in skills list."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from strata.kernels.gen.metrics import (
    BASELINES,
    BENEFICIAL,
    FAST_PS,
    HARMFUL,
    Lift,
    Sample,
    Scores,
    SkillAB,
    fast_key,
    samples,
    total_tokens,
)
from strata.kernels.gen.records import Attempt
from strata.views.kernels import _fmt, _pct, _speedup

GEN_STYLE = {"ok": "green", "slow": "yellow", "mismatch": "red", "compile": "red",
             "format": "dim", "static": "magenta", "runtime": "magenta",
             "implausible": "magenta", BENEFICIAL: "green", HARMFUL: "bold red"}


def _styled(text: str, cheat: bool = False) -> str:
    style = GEN_STYLE.get(text)
    shown = escape(text) + (" (cheat)" if cheat else "")
    return f"[{style}]{shown}[/{style}]" if style else shown


def _tokens(a: Attempt) -> int | None:
    """In + out; absent when the server left either out (a partial sum would mislead)."""
    return total_tokens([a])


def _table(title: str, columns: tuple[str, ...], right: tuple[str, ...],
           caption: str | None = None) -> Table:
    t = Table(title=title, caption=caption)
    for col in columns:
        t.add_column(col, justify="right" if col in right else "left", overflow="fold")
    return t


# -- attempts ----------------------------------------------------------------------------------

ATTEMPT_COLUMNS = ("run", "sample", "turn", "op", "model", "status", "reason", "tokens",
                   "latency_s", "speedup")
ATTEMPT_NUMERIC = ("sample", "turn", "tokens", "latency_s", "speedup")


def attempt_record(a: Attempt) -> dict[str, Any]:
    """Everything but the prompt, reply and code (the jsonl export carries those)."""
    return {"id": a.id, "run": a.run, "sample": a.sample, "turn": a.turn, "op": a.op,
            "dialect": a.dialect, "device": a.device, "model": a.model,
            "endpoint": a.endpoint, "status": a.status, "reason": a.reason,
            "cheat": a.cheat, "registered": a.registered, "tokens": _tokens(a),
            "tokens_in": a.tokens_in, "tokens_out": a.tokens_out, "latency_s": a.latency_s,
            "speedup": a.timing.speedup_eager, "speedup_best": a.timing.speedup_best,
            "roofline_share": a.timing.roofline_share, "code_hash": a.code_hash,
            "template_hash": a.template_hash, "skill": a.skill, "created_at": a.created_at,
            "feedback": a.feedback}


def attempts_table(attempts: list[Attempt]) -> Table:
    t = _table("Kernel generation attempts", ATTEMPT_COLUMNS, ATTEMPT_NUMERIC)
    for a in attempts:
        r = attempt_record(a)
        t.add_row(escape(a.run), str(a.sample + 1), str(a.turn), a.op, escape(a.model),
                  _styled(a.status, a.cheat), escape(a.reason), _fmt(r["tokens"], "d"),
                  _fmt(a.latency_s, ".1f"), _speedup(r["speedup"]))
    return t


# -- one generate run, per sample --------------------------------------------------------------

SAMPLE_COLUMNS = ("op", "sample", "turns", "status", "reason", "first_correct", "speedup",
                  "speedup_best", "roofline_share", "tokens", "registered")
SAMPLE_NUMERIC = ("sample", "turns", "first_correct", "speedup", "speedup_best",
                  "roofline_share", "tokens")


def sample_record(s: Sample) -> dict[str, Any]:
    """A sample by its best turn (see strata.kernels.gen.metrics)."""
    best = s.result
    return {"run": s.run, "model": s.model, "dialect": s.dialect, "op": s.op,
            "sample": s.sample, "skill": s.skill, "turns": len(s.attempts),
            "best_turn": best.turn, "status": best.status, "reason": best.reason,
            "cheat": best.cheat, "first_correct": s.first_correct,
            "speedup": best.timing.speedup_eager, "speedup_best": best.timing.speedup_best,
            "roofline_share": best.timing.roofline_share, "tokens": s.tokens,
            "registered": any(a.registered for a in s.attempts)}


def samples_table(results: list[Sample], title: str = "Kernel generation") -> Table:
    t = _table(title, SAMPLE_COLUMNS, SAMPLE_NUMERIC,
               caption="each sample by its best turn; samples and turns count from 1")
    for s in results:
        r = sample_record(s)
        t.add_row(s.op, str(s.sample + 1), str(r["turns"]), _styled(r["status"], r["cheat"]),
                  escape(r["reason"]), _fmt(r["first_correct"], "d"), _speedup(r["speedup"]),
                  _speedup(r["speedup_best"]), _pct(r["roofline_share"]),
                  _fmt(r["tokens"], "d"), "yes" if r["registered"] else "")
    return t


class SampleBoard:
    """A generate run's one status line: each sample's turn and latest status (the run's
    `on_turn(sample, turn, what)`)."""

    def __init__(self, status: Any, samples: int, label: str = "") -> None:
        self.status, self.label = status, label
        self.state = ["waiting"] * samples

    def __call__(self, sample: int, turn: int, what: str) -> None:
        self.state[sample] = f"t{turn} {what}"
        cells = " · ".join(f"#{i + 1} {s}" for i, s in enumerate(self.state))
        self.status.update(escape(f"{self.label}{cells}"))


def render_generate(out: Console, err: Console, result: Any) -> None:
    """A generate run (kernels.gen.loop.GenResult): its samples' table, then on stderr why
    the conversations stopped and what came of the best kernel."""
    config = result.config
    out.print(samples_table(samples(result.attempts),
                            f"{config.op} ({config.dialect}, {config.device}) by {config.model}"))
    stops = {s.stop for s in result.samples}
    err.print("stopped: " + "; ".join(sorted(stops)), markup=False)
    best = result.best
    if best is None:
        err.print(f"no correct kernel in {len(result.attempts)} attempts (see `strata kernels "
                  f"attempts --run {config.run}`)", markup=False)
    elif result.registered:
        err.print(f"registered {result.registered} (sample {best.sample + 1}, turn "
                  f"{best.turn}); `strata kernels explain {best.op}` shows dispatch",
                  markup=False)


def no_bench_note(err: Console) -> None:
    """What --no-bench leaves unchecked."""
    err.print("not benchmarked (--no-bench): correct means verified; kernels that skip "
              "work only when timed are caught by the benchmark alone", markup=False)


# -- the eval leaderboard ----------------------------------------------------------------------

FAST_COLUMNS = tuple(f"fast_{fast_key(b, p)}" for b in BASELINES for p in FAST_PS)


def scores_record(s: Scores) -> dict[str, Any]:
    """A flat row: pass@k as `pass@K`, fast_p as `fast_eager@P` / `fast_best@P`."""
    record: dict[str, Any] = {
        "model": s.model, "dialect": s.dialect, "skill": s.skill, "samples": s.samples,
        "ops": s.ops, "attempts": s.attempts, "compile_rate": s.compile_rate,
        "correct_rate": s.correct_rate}
    record.update({f"pass@{k}": v for k, v in s.pass_at.items()})
    record.update({f"fast_{k}": v for k, v in s.fast.items()})
    record.update({"geomean_speedup": s.geomean_speedup, "coverage": s.coverage,
                   "turns_to_first_correct": s.turns_to_first_correct,
                   "tokens_per_correct": s.tokens_per_correct, "cheats": s.cheats,
                   "cheat_rate": s.cheat_rate})
    return record


def leaderboard_columns(scores: list[Scores]) -> tuple[str, ...]:
    """The md columns: the pass@k present in these rows, then the fixed metrics."""
    ks = sorted({k for s in scores for k in s.pass_at})
    return ("model", "dialect", "samples", "ops", "compile_rate", "correct_rate",
            *(f"pass@{k}" for k in ks), *FAST_COLUMNS, "geomean_speedup", "coverage",
            "turns_to_first_correct", "tokens_per_correct", "cheat_rate")


def leaderboard_numeric(scores: list[Scores]) -> tuple[str, ...]:
    return tuple(c for c in leaderboard_columns(scores) if c not in ("model", "dialect"))


def leaderboard_table(scores: list[Scores]) -> Table:
    ks = sorted({k for s in scores for k in s.pass_at})
    heads = ("model", "dialect", "samples", "compile", "correct",
             *(f"pass@{k}" for k in ks), *(fast_key(b, p) for b in BASELINES for p in FAST_PS),
             "x eager (geomean)", "coverage", "turns", "tokens/correct", "cheats caught")
    t = _table("Models as kernel writers on this host", heads,
               tuple(h for h in heads if h not in ("model", "dialect")),
               caption="fast eager@p / best@p: correct and > p x torch eager / the best "
                       "verified implementation")
    for s in scores:
        t.add_row(escape(s.model), s.dialect + (f" +{escape(s.skill)}" if s.skill else ""),
                  f"{s.samples} ({s.ops} ops)", _pct(s.compile_rate), _pct(s.correct_rate),
                  *(_pct(s.pass_at.get(k)) for k in ks),
                  *(_pct(s.fast[fast_key(b, p)]) for b in BASELINES for p in FAST_PS),
                  _speedup(s.geomean_speedup), _pct(s.coverage),
                  _fmt(s.turns_to_first_correct, ".1f"), _fmt(s.tokens_per_correct, ".0f"),
                  f"{s.cheats} ({_pct(s.cheat_rate)})")
    return t


# -- skills A/B --------------------------------------------------------------------------------

AB_COLUMNS = ("metric", "without", "with", "lift", "lo95", "hi95", "ratio", "verdict")
AB_NUMERIC = ("without", "with", "lift", "lo95", "hi95", "ratio")


def _lift_record(lift: Lift) -> dict[str, Any]:
    return {"metric": lift.metric, "without": lift.without, "with": lift.with_,
            "lift": lift.lift, "lo95": lift.lo95, "hi95": lift.hi95, "ratio": None,
            "verdict": lift.verdict}


def ab_records(ab: SkillAB) -> list[dict[str, Any]]:
    """Three rows: correct rate, fast_1, tokens (with their ratio); each names the arm."""
    tokens = {"metric": "tokens", "without": ab.tokens_without, "with": ab.tokens_with,
              "lift": None, "lo95": None, "hi95": None, "ratio": ab.token_ratio,
              "verdict": ""}
    head = {"skill": ab.skill, "model": ab.model, "dialect": ab.dialect, "units": ab.units,
            "unpaired": ab.unpaired}
    return [{**head, **r} for r in (_lift_record(ab.correct), _lift_record(ab.fast_1), tokens)]


def ab_document(skill: str, model: str, ops: list[str], ab: SkillAB) -> dict[str, Any]:
    """`strata skills eval -o json`: the skill (name@hash), the student, the held-out ops,
    the A/B rows and the verdict."""
    return {"skill": skill, "model": model, "ops": ops, "rows": ab_records(ab),
            "verdict": ab.verdict}


def _signed_pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.0f} pt"


def ab_table(ab: SkillAB) -> Table:
    caption = (f"{ab.units} paired (op, sample) units"
               + (f", {ab.unpaired} unpaired left out" if ab.unpaired else "")
               + "; 95% CI: paired bootstrap. Verdict: "
               + _styled(ab.verdict))
    t = _table(f"Skill {escape(ab.skill or '-')} on {escape(ab.model)} ({ab.dialect})",
               ("metric", "without", "with", "lift", "95% CI", "verdict"),
               ("without", "with", "lift", "95% CI"), caption)
    for lift in (ab.correct, ab.fast_1):
        t.add_row(lift.metric, _pct(lift.without), _pct(lift.with_), _signed_pct(lift.lift),
                  f"[{_signed_pct(lift.lo95)}, {_signed_pct(lift.hi95)}]",
                  _styled(lift.verdict))
    ratio = "-" if ab.token_ratio is None else f"ratio {ab.token_ratio:.2f}"
    t.add_row("tokens", _fmt(ab.tokens_without, "d"), _fmt(ab.tokens_with, "d"), ratio, "", "")
    return t


# -- built-in skills ---------------------------------------------------------------------------

def builtin_skill_line(ref: str, skill: Any) -> str:
    """`strata skills list`: the --skill reference, its hash, its words and its train ops."""
    train = ", ".join(skill.meta.get("train_ops") or [])
    return f"{ref}  {skill.ref}  ({len(skill.text.split())} words; train ops: {train})"
