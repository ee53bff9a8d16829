"""The model commands: compare, history, report, quality, fit (bench: cli/bench.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from strata.backends import names
from strata.cli import DbOption, app, err, open_store, out
from strata.cli.helptext import reflowed
from strata.cli.output import (
    CHOICES,
    FormatOption,
    JsonOption,
    ProgressOption,
    no_store,
    output_format,
    read_store,
)
from strata.errors import InputError
from strata.views.console import set_progress
from strata.views.output import emit

Opt = typer.Option


@app.command()
@reflowed
def compare(
    side_a: Annotated[str, typer.Argument(metavar="A", help="Baseline: run id, run:N, "
                                          "host:FP, backend:NAME, commit:SHA (strata's "
                                          "commit) or rank:FP (the latest ranking of a host).")],
    side_b: Annotated[str, typer.Argument(metavar="B", help="Compared against A, same forms.")],
    fmt: FormatOption = None,
    json_out: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Speedup of B over A on every configuration both have, with its significance.

    Reads the database only: nothing is created or written.

    [bold]Examples[/bold]
      strata compare 3 4                          [dim]# run 4 vs run 3[/dim]
      strata compare backend:torch backend:llamacpp
      strata compare host:0de260d8 host:9a1f3c2b -o csv
      strata compare rank:0de260d8 rank:9a1f3c2b  [dim]# scores, per profile[/dim]
    """
    from strata.compare import compare as run_compare
    from strata.compare import pair_records
    from strata.rank.compare import FIELDS as RANK_FIELDS
    from strata.rank.compare import compare_rankings, is_rank
    from strata.views.compare import COMPARE_FIELDS, compare_table
    from strata.views.rank import rank_compare_table

    fmt = output_format(fmt, json_out)
    conn = read_store(db)
    if conn is None:
        raise InputError(f"{no_store(db)}; run strata bench first")
    if is_rank(side_a) or is_rank(side_b):
        rows = compare_rankings(conn, side_a, side_b)
        emit(out, fmt, rows, md_columns=RANK_FIELDS,
             table=lambda: out.print(rank_compare_table(rows, side_a, side_b)))
        return
    pairs = run_compare(conn, side_a, side_b)
    emit(out, fmt, pair_records(conn, pairs), md_columns=COMPARE_FIELDS,
         table=lambda: out.print(compare_table(pairs, side_a, side_b)))


@app.command()
@reflowed
def history(
    model: Annotated[str | None, typer.Argument(help="Only this model (as given to bench).")]
    = None,
    backend: Annotated[str | None, typer.Option("--backend", "-B", help="Only this backend.")]
    = None,
    test: Annotated[str | None, typer.Option("--test", help="Only this test, e.g. tg128.")]
    = None,
    fmt: Annotated[str | None, typer.Option(
        "--format", "-o", metavar="FORMAT", show_default=False,
        help="table|json|jsonl|csv|md|sql")] = None,
    json_out: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Every stored bench result over time: run, date, host, strata's commit, t/s, and the
    llama.cpp commit it ran on.

    Reads the database only: nothing is created or written. A machine format
    (-o json, jsonl, csv, sql) prints every field of each result: bench's record
    plus its run.

    [bold]Examples[/bold]
      strata history                             [dim]# everything, oldest first[/dim]
      strata history synthetic:tiny@q8_0 -B llamacpp --test tg128
      strata history -o csv > history.csv
      strata history -o sql | sqlite3 llama-bench.db  [dim]# llama-bench's test table[/dim]
    """
    from strata.compare import history as run_history
    from strata.views.compare import HISTORY_FIELDS, history_table

    fmt = output_format(fmt, json_out, (*CHOICES, "sql"))
    conn = read_store(db)
    try:
        if conn is None:
            raise InputError(f"{no_store(db)}; run strata bench first")
        rows = run_history(conn, model, backend, test)
    except InputError as exc:
        if fmt == "table":
            raise
        # a machine format reads "no results" as an empty list (as `strata hosts` does);
        # the reason goes to stderr
        err.print(str(exc), markup=False, highlight=False)
        rows = []
    records = [h.to_record() for h in rows]
    if fmt == "sql":
        from strata.store.export import FORMATS

        out.file.write(FORMATS["sql"](records))
        return
    emit(out, fmt, records, md_columns=HISTORY_FIELDS,
         table=lambda: out.print(history_table(rows)))


@app.command()
@reflowed
def report(
    out_path: Annotated[Path, typer.Option("--out", metavar="FILE", help="Where to write the "
                                           "HTML file.")] = Path("report.html"),
    open_it: Annotated[bool, typer.Option("--open", help="Open it in the default browser "
                                          "once written.")] = False,
    on: Annotated[list[str] | None, typer.Option(
        "--on", metavar="DEVICE", help="Add a 'what if' section: this host's models "
        "predicted on a catalogue device (repeatable).", show_default=False)] = None,
    db: DbOption = None,
) -> None:
    """One self-contained HTML report: host card, roofline chart, t/s vs depth and prompt size,
    sustained runs and throttling, quantisation frontier, fit table (and with --on, what the
    same models would do on other devices).

    No scripts, fonts or network requests: the file opens offline and can be shared as is.
    A section without data says which command fills it. The database is only read.

    [bold]Examples[/bold]
      strata report                          [dim]# writes ./report.html[/dim]
      strata report --out ~/host.html --open
      strata report --on rtx-4090 --on m4-max-40c
    """
    from strata.commands.report import open_report, run_report
    from strata.report.build import check_out

    check_out(out_path)  # before anything is read or built
    if on:  # a device name that is wrong is said before the database is looked at
        from strata.whatif.plan import parse_on

        for name in on:
            parse_on(name)
    conn = read_store(db)
    if conn is None:
        raise InputError(f"{no_store(db)}; run strata probe or strata bench first")
    outcome = run_report(conn, out_path, on=tuple(on or ()))
    out.print(outcome.summary(), highlight=False, soft_wrap=True, markup=False)
    if open_it and not open_report(outcome.path):
        err.print(f"could not start a browser: open {outcome.path} by hand", markup=False)


@app.command()
@reflowed
def quality(
    model: Annotated[str, typer.Argument(
        help="file.gguf, a Hugging Face dir (with its tokenizer files), synthetic:<preset>"
        "\\[@quant] (f32, f16, q8_0, q4_0, q6_k, q5_k_m, q4_k_m, q3_k_m, q2_k) or "
        "ollama:NAME\\[:TAG] (a pulled model).")],
    ref: Annotated[str | None, typer.Option(
        "--ref", metavar="MODEL", help="Reference with the same vocabulary (e.g. the f16 of a "
        "q4_0): adds KL divergence, top-1 agreement and the speed ratio of the two.")] = None,
    quants: Annotated[str | None, typer.Option(
        "--quants", metavar="MIXES", help="Quantise MODEL (an f16/f32 GGUF) to each of these "
        "llama.cpp mixes with llama.cpp's own quantizer (q8_0, q6_k, q5_k_m, q4_k_m, q4_0, "
        "q3_k_m, q2_k, f16; comma-separated) and score each one against MODEL.",
        show_default=False)] = None,
    text: Annotated[Path | None, typer.Option(
        "--text", metavar="FILE", help="UTF-8 text to score (default: the pydoc topics "
        "that ship with Python, offline).")] = None,
    ctx: Annotated[int, typer.Option(
        "--ctx", help="Tokens per chunk; the second half of each chunk is scored "
        "(llama-perplexity's convention).")] = 512,
    backend: Annotated[str, typer.Option(
        "--backend", "-B", help=f"{', '.join(names(scoring=True))}, both, or auto (the first "
        f"of {', '.join(names(scoring=True))} that can read the model, in that order).")]
    = "auto",
    max_chunks: Annotated[int, typer.Option(
        "--max-chunks", metavar="K", help="Score only the first K chunks (bounds the time).")]
    = 32,
    fmt: FormatOption = None,
    json_out: JsonOption = False,
    progress: ProgressOption = None,
    db: DbOption = None,
) -> None:
    """What a quantisation costs: perplexity; with --ref, KL, top-1 and the speed ratio.

    Every backend scores the same token ids and the same weights (torch: the GGUF in float32).
    Results are stored with the host, next to the bench results.

    [bold]Examples[/bold]
      strata quality synthetic:smollm2-135m@q8_0          [dim]# perplexity[/dim]
      strata quality model-q4_0.gguf --ref model-f16.gguf  [dim]# KL, top-1, speed[/dim]
      strata quality model.gguf --backend both --ctx 256   [dim]# llama.cpp vs torch[/dim]
      strata quality model.gguf --text my.txt --max-chunks 64 -o json
      strata quality synthetic:llama-3.2-1b@f16 --quants q8_0,q6_k,q4_k_m
    """
    fmt = output_format(fmt, json_out)
    if progress is not None:
        set_progress(progress)
    if quants is not None and ref is not None:
        raise InputError("--quants scores each mix against MODEL itself: drop --ref")
    conn = open_store(db)  # fail on a bad --db before tokenising or loading anything
    from strata.commands.quality import quality_main, quants_main
    from strata.quality.run import QualityConfig

    if quants is not None:
        config = QualityConfig(model=model, text=text, ctx=ctx, backend=backend,
                               max_chunks=max_chunks)
        quants_main(model, quants, config, conn, out, err, fmt)
        return
    quality_main(model, ref, text, ctx, backend, max_chunks, False, conn, out, err, fmt=fmt)


@app.command()
@reflowed
def fit(
    model: Annotated[str, typer.Argument(
        metavar="MODEL", help="file.gguf, a Hugging Face dir, synthetic:<preset>@<quant> "
        "(f32, f16, q8_0, q4_0, or llama.cpp's mixes q6_k, q5_k_m, q4_k_m, q3_k_m, q2_k) or "
        "ollama:NAME\\[:TAG]. Only its metadata is read: nothing is "
        "loaded or written.")],
    ctx: Annotated[int | None, typer.Option("--ctx", "-c", help="Context per sequence, in "
                                            "tokens (default 4096, or the model's own "
                                            "context when shorter).", show_default=False)]
    = None,
    batch: Annotated[int, typer.Option("-np", "--parallel", metavar="N",
                                       help="Parallel sequences, each with its own context "
                                       "(llama.cpp's -np; bench's -b is n_batch).")] = 1,
    old_batch: Annotated[int | None, typer.Option("--batch", hidden=True)] = None,
    kv_type: Annotated[str | None, typer.Option("--kv-type", help="KV cache type for llamacpp: "
                                                "f16 (default), q8_0 or q4_0.",
                                                show_default=False)] = None,
    backend: Annotated[str, typer.Option("--backend", "-B",
                                         help=f"{' or '.join(names(fit=True))}.")]
    = "llamacpp",
    swa_full: Annotated[bool, typer.Option("--swa-full", help="llama.cpp's --swa-full: "
                                           "sliding-window layers (Gemma 3) keep the whole "
                                           "context instead of their window.")] = False,
    on: Annotated[list[str] | None, typer.Option(
        "--on", metavar="DEVICE", help="Plan on a catalogue device instead of this host "
        "(repeatable; DEVICE:GiB for another memory size): strata whatif --list.",
        rich_help_panel="Another machine", show_default=False)] = None,
    ram: Annotated[float | None, typer.Option(
        "--ram", metavar="GiB", help="RAM beside a discrete --on GPU (default: this "
        "host's).", rich_help_panel="Another machine", show_default=False)] = None,
    fmt: FormatOption = None,
    json_out: JsonOption = False,
    db: DbOption = None,
) -> None:
    """Will MODEL fit on this machine, with how much context, and how fast would it run?

    Per device: weights (exact per-tensor bytes), KV cache (grouped-query aware), buffers and
    overhead (the rules are printed), the verdict with the -ngl to pass to llama.cpp, the
    largest context and the quantisations that fit. Predicted t/s = this host's measured
    roofline x the median η of its past bench results (else a stated prior). The database is
    only read.

    [bold]Examples[/bold]
      strata fit synthetic:llama-3.1-8b@q4_0 --ctx 32768
      strata fit model.gguf --kv-type q8_0 -np 4
      strata fit ./hf-model-dir --backend torch -o json
      strata fit synthetic:llama-3.1-70b@q4_k_m --on rtx-5090 --on m4-max-40c
    """
    fmt = output_format(fmt, json_out)
    if old_batch is not None:
        raise InputError(f"--batch {old_batch}: parallel sequences are -np/--parallel "
                         "(llama.cpp's name; -b is n_batch in strata bench and llama-bench)")
    conn = read_store(db)  # fail on a bad --db before reading the model
    from strata.commands.fit import print_fit, run_fit

    if swa_full and backend != "llamacpp":
        raise InputError(f"--swa-full is llama.cpp's option; -B {backend} sizes its own cache")
    if on:
        from strata.commands.fit import run_fit_on

        report = run_fit_on(conn, model, on, ctx=ctx, batch=batch, kv_type=kv_type,
                            backend=backend, swa_full=swa_full, ram_gib=ram)
    else:
        if ram is not None:
            raise InputError("--ram sizes the host of an --on GPU; this host's RAM is probed")
        report = run_fit(conn, model, ctx=ctx, batch=batch, kv_type=kv_type,
                         backend=backend, console=err, swa_full=swa_full)
    print_fit(report, fmt, out)

