"""`strata quality`: the stored measurement (quality/stored.py) with a progress bar, then
printing."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from strata.quality.run import QualityConfig, QualityResult
from strata.quality.stored import MEASUREMENT_KIND, ScoreProgress, score_and_store
from strata.views.console import progress_bar

__all__ = ["MEASUREMENT_KIND", "print_results", "quality_main", "quality_record",
           "quants_main", "run_quality_command", "score_progress"]


def run_quality_command(conn: sqlite3.Connection, config: QualityConfig,
                        console: Console) -> list[QualityResult]:
    """Every input error surfaces before the host probe and before any weights load;
    progress on `console`."""
    return score_and_store(conn, config, console, score_progress(console))


def score_progress(console: Console) -> ScoreProgress:
    """A progress bar per backend on `console`, for quality/stored.py's `score_and_store`."""
    def bar_for(what: str, total: int) -> tuple[Any, Any]:
        bar = progress_bar(console)
        task = bar.add_task(what, total=total)
        return bar, lambda done, _n: bar.update(task, completed=done)

    return bar_for


def quality_record(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored quality result (QualityResult.to_dict) in the output vocabulary
    (docs/output.md): flat, the model as model_filename, speeds as *_ts, times as *_s."""
    r = dict(stored)
    ci, speed, text = r.pop("ppl_ci95"), r.pop("speed") or {}, r.pop("text")
    out = {"model_filename": r.pop("model"), "ref_filename": r.pop("ref"),
           "backend": r.pop("backend"), "n_ctx": r.pop("ctx"), "n_chunks": r.pop("n_chunks"),
           "n_tokens": r.pop("n_tokens"), "ppl": r.pop("ppl"), "ppl_sd": r.pop("ppl_sd"),
           "ppl_ci95_low": ci[0] if ci else None, "ppl_ci95_high": ci[1] if ci else None}
    out.update((k, r.pop(k)) for k in ("ref_ppl", "delta_ppl", "kl", "kl_median", "kl_p99",
                                        "kl_max", "top1", "speed_ratio", "chunk_nll"))
    out.update({"decode_ts": speed.get("model_tps"), "ref_decode_ts": speed.get("ref_tps"),
                "speed_backend": speed.get("backend"), "speed_test": speed.get("test"),
                "speed_caveat": speed.get("caveat"),
                "text_name": text["name"], "text_sha256": text["sha256"],
                "text_tokens": text["tokens"], "time_s": r.pop("seconds")})
    out.update(r)  # tokenizer, model_label, ref_label, scoring, info
    return out


def print_results(results: list[QualityResult], fmt: str, out: Console,
                  err: Console) -> None:
    """fmt: table, json, jsonl, csv or md."""
    from strata.views.output import emit
    from strata.views.quality import MD_FIELDS, frontier_line, notes, quality_table

    stored = [r.to_dict() for r in results]

    def table() -> None:
        out.print(quality_table(stored))
        for r in stored:
            if r["ref"] is not None:
                out.print(frontier_line(r), highlight=False, markup=False)
        for line in notes(stored):  # model names and text paths as typed: escaped
            err.print(f"[dim]note[/dim] {escape(line)}", highlight=False)

    emit(out, fmt, [quality_record(r) for r in stored], table=table, md_columns=MD_FIELDS)


def quality_main(model: str, ref: str | None, text: Path | None, ctx: int, backend: str,
                 max_chunks: int, json_out: bool, conn: sqlite3.Connection, out: Console,
                 err: Console, fmt: str | None = None) -> list[QualityResult]:
    """What the CLI command calls: run, store, print (fmt, else json_out: json or table)."""
    from strata.quality.stored import Partial

    config = QualityConfig(model=model, ref=ref, text=text, ctx=ctx, backend=backend,
                           max_chunks=max_chunks)
    chosen = fmt or ("json" if json_out else "table")
    try:
        results = run_quality_command(conn, config, err)
    except Partial as part:  # what was measured is printed before the failure is reported
        print_results(part.results, chosen, out, err)
        raise part.error from None
    print_results(results, chosen, out, err)
    return results


def quants_main(model: str, quants: str, config: QualityConfig, conn: sqlite3.Connection,
                out: Console, err: Console, fmt: str) -> list[QualityResult]:
    """`--quants`: MODEL (f16/f32) quantised to each mix by llama.cpp, each scored with MODEL
    as the reference; one table (and frontier line) for them all. Each mix is named
    "MODEL@q4_k_m" (what the user typed, plus the mix), never by its cache path: the table,
    the stored rows and the report's frontier all show that name, model_label the mix."""
    from dataclasses import replace

    from strata.quality.quants import mix_files, parse_quants

    mixes = parse_quants(quants)  # a bad list fails before anything is quantised
    files = mix_files(model, mixes, lambda m: err.print(m, markup=False, highlight=False))
    results: list[QualityResult] = []
    for mix, path in files:
        named = replace(config, model=str(path), ref=model, name=f"{model}@{mix.key}")
        results += run_quality_command(conn, named, err)
    print_results(results, fmt, out, err)
    return results
