"""`strata rank`: which model to run here, for what."""

from __future__ import annotations

from typing import Annotated

import typer

from strata.cli import DbOption, app, err, open_store, out
from strata.cli.output import FormatOption, JsonOption, ProgressOption, output_format
from strata.errors import InputError
from strata.rank.profiles import profiles_help
from strata.views.console import set_progress
from strata.views.output import emit

Opt = typer.Option


CANDIDATES = "Candidates besides MODEL"


@app.command()
def rank(
    models: Annotated[list[str] | None, typer.Argument(
        metavar="MODEL", help="Models to rank: .gguf files, a folder of them, Hugging Face "
        "dirs, synthetic:<preset>\\[@quant], ollama:NAME, http://host:port endpoints.",
        show_default=False)] = None,
    profile: Annotated[str, Opt("--profile", metavar="NAMES", help="Comma list of profiles, "
                                "or all.")] = "all",
    presets: Annotated[bool, Opt("--presets", rich_help_panel=CANDIDATES,
                                 help="Also every synthetic preset (at "
                                 "--quant); those that do not fit are listed, predicted.")]
    = False,
    quant: Annotated[str, Opt("--quant", rich_help_panel=CANDIDATES,
                              help="Quantisation of --presets: f32, f16, q8_0, q4_0.")]
    = "q4_0",
    include_test_models: Annotated[bool, Opt(
        "--include-test-models", rich_help_panel=CANDIDATES,
        help="With --presets, strata's own tiny test models too (not published models: "
        "left out by default).")] = False,
    backend: Annotated[str, Opt("--backend", "-B", help="Backend that runs files and presets "
                                "(endpoints use openai).")] = "llamacpp",
    quality: Annotated[bool, Opt("--quality", help="Also perplexity (and KL with --ref) of "
                                 "each model; prints the quality/speed frontier.")] = False,
    ref: Annotated[str | None, Opt("--ref", metavar="MODEL", help="Reference for KL with "
                                   "--quality (same vocabulary).")] = None,
    budget_min: Annotated[float, Opt("--budget-min", metavar="MINUTES", help="Most minutes "
                                     "of measuring (the slowest candidates are cut).")]
    = 10.0,
    fmt: FormatOption = None,
    json_out: JsonOption = False,
    progress: ProgressOption = None,
    db: DbOption = None,
) -> None:
    """Which model should I run here, for what? Ranks models per workload profile.

    Each profile is a workload (a data file) with targets that make it usable:
    {profiles}.

    score = 100 x geometric mean of (prompt t/s / target, gen t/s / target,
    target TTFT / TTFT) over the profile's depths: 100 is exactly on target, the
    same formula on every host. TTFT is an endpoint's streamed one; in-process
    it is prompt / prompt t/s + 1 / gen t/s. Verdict at the worst depth: usable (TTFT
    and gen t/s on target), marginal (within 2x), unusable.

    Stored results are reused when host, software and config match; what is
    missing is measured, fastest candidates first, within --budget-min. A model
    that does not fit (strata fit), or is cut by the budget, is listed with its
    predicted figures (roofline x η), marked "predicted". A model is never measured
    past its context: a profile that needs more is "context too short" for it. A
    file that cannot be read is a skipped line; the others are still ranked.

    [bold]Examples[/bold]
      strata rank --presets                        [dim]# every preset, q4_0[/dim]
      strata rank models/ --profile chat,code
      strata rank a.gguf b.gguf --quality --budget-min 20 -o md
      strata rank http://127.0.0.1:11434 --profile chat
    """
    from strata.commands.bench import sweep_progress
    from strata.commands.quality import score_progress
    from strata.rank.candidates import expand
    from strata.rank.profiles import choose
    from strata.rank.ranking import RankProgress, RankRequest, run_rank
    from strata.views.rank import RANK_COLUMNS, profile_table, summary_lines

    set_progress(progress)
    fmt = output_format(fmt, json_out)
    if not 0 < budget_min <= 24 * 60:
        raise InputError(f"--budget-min {budget_min:g}: must be > 0 and at most 1440")
    if ref is not None and not quality:
        raise InputError("--ref is the reference for --quality: add --quality")
    request = RankRequest(refs=expand(models or [], presets, quant, include_test_models),
                          profiles=choose(profile),
                          backend=backend, budget_s=budget_min * 60, quality=quality,
                          ref=ref)
    outcome = run_rank(open_store(db), request, err,
                       RankProgress(sweep_progress(err), score_progress(err)))

    def tables() -> None:
        for entries in outcome.entries.values():
            out.print(profile_table(entries, quality))

    emit(out, fmt, outcome.records(), table=tables, md_columns=RANK_COLUMNS)
    for line in summary_lines(outcome, quality):
        err.print(line, markup=False, highlight=False, soft_wrap=True)


rank.__doc__ = (rank.__doc__ or "").replace("{profiles}", profiles_help())
