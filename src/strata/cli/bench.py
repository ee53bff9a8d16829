"""`strata bench`: its flags live in commands/bench_options.py (BenchFlags), its work in
commands/bench.py; this file only binds them to the CLI."""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from strata.cli import DbOption, app, err, open_store, out
from strata.cli.output import with_json
from strata.commands.bench_options import (
    FORMATS_HELP,
    BenchFlags,
    build_config,
    command_signature,
)
from strata.errors import InputError, StrataError

Opt = typer.Option


def bench(**params: Any) -> None:
    """How fast a model runs here, on llama.cpp, PyTorch or a server, and why.

    Tests follow llama-bench: pp<N> prompt processing, tg<M> generation,
    pp<N>+tg<M>, each optionally @d<D> after D tokens of context. Lists and ranges
    sweep (-p 128,512 -t 1-2). Every result is stored with the host, versions,
    full config and raw samples.

    An endpoint under serving load (--concurrency, --request-rate): each level is
    a timed window of --num-requests requests; it reports output t/s, requests/s,
    TTFT, ITL and end-to-end percentiles, goodput under the stated SLO, and says
    when the server queues requests.

    [bold]What the figures mean[/bold]
      t/s      mean ± SD of n timed repetitions (n=1: no SD; ! marks SD > mean)
      ceiling  the t/s this host's measured roofline allows for this model and
               test: the lower of two roofs. Memory: bandwidth ÷ bytes read per
               token (weights as stored + KV cache; a prefill pass of up to 512
               tokens reads them once). Compute: the peak of the arithmetic the
               backend runs (int8 dot products for quantised weights on
               llama.cpp and lab, else the weights' float type) ÷ FLOPs per
               token.
      η        efficiency: measured t/s ÷ ceiling. 1 is the roofline; below
               0.4 is flagged (slow path, offload, throttling, busy host);
               above 1.05 means the byte/FLOP model or the peak is wrong.
      bound    the roof that gives the ceiling: memory or compute.

    Exit status: 0 done (skipped pairs listed), 1 a test failed (results finished
    before it are printed and kept), 2 bad input or nothing ran, 130 interrupted
    (finished results printed and kept).

    [bold]Examples[/bold]
      strata bench                                   [dim]# embedded synthetic preset[/dim]
      strata bench synthetic:qwen2.5-0.5b@q4_0 -p 128,512 -n 64
      strata bench model.gguf -B llamacpp -t 1-2 -d 0,1024 -o md
      strata bench http://127.0.0.1:8080 --model-name my-model -p 256 -n 64
      strata bench http://127.0.0.1:8080 --concurrency 1,2,4,8 -p 256 -n 64
    """
    from strata.commands.bench import print_outcome, run_bench
    from strata.views.console import set_progress

    refuse_llama_bench_only(params)
    fmt, list_presets, db = params.pop("fmt"), params.pop("list_presets"), params.pop("db")
    fmt = with_json(fmt, params.pop("json_out"))
    progress = params.pop("progress")
    if progress is not None:
        set_progress(progress)  # the command's own flag wins over the root's
    if list_presets:
        _print_presets()
        return
    if fmt not in FORMATS_HELP:
        raise InputError(f"--format {fmt}: choose one of {', '.join(FORMATS_HELP)}")
    config = build_config(BenchFlags(**params))
    outcome = run_bench(open_store(db), config, err, keep_error=True)
    print_outcome(outcome, fmt, out, err)
    if outcome.error is not None:
        raise _failure(outcome.error)  # after the kept results: they are printed first
    reason = outcome.nothing_ran()
    if reason:
        raise InputError(reason)
    if outcome.status == "incomplete":
        raise typer.Exit(130)


def _failure(exc: BaseException) -> BaseException:
    """The error that stopped a sweep, as the CLI reports it: a StrataError keeps its own
    message and exit code; anything else is a failure of the thing measured (exit 1)."""
    if isinstance(exc, StrataError):
        return exc
    return StrataError(f"bench stopped: {type(exc).__name__}: {exc}")


# llama-bench flags strata does not take: accepted by the parser (hidden) so that each is
# refused by name, never misparsed (-nkvo would read as -n kvo), with why.
LLAMA_BENCH_ONLY: dict[tuple[str, ...], str] = {
    ("-mmp", "--mmap"): "strata's llama.cpp backend always maps the file",
    ("-nkvo", "--no-kv-offload"): "the KV cache follows -ngl's layers",
    ("-sm", "--split-mode"): "strata runs on one device per backend",
    ("-mg", "--main-gpu"): "strata runs on one device per backend (--device for torch)",
    ("-ts", "--tensor-split"): "strata runs on one device per backend",
    ("-ot", "--override-tensor"): "no per-tensor placement",
    ("-ncmoe", "--n-cpu-moe"): "strata fit plans expert offload; bench does not place it",
    ("-cmoe", "--cpu-moe"): "strata fit plans expert offload; bench does not place it",
    ("--numa",): "no NUMA policy",
    ("-C", "--cpu-mask"): "no CPU affinity mask",
    ("--cpu-strict",): "no CPU affinity mask",
    ("--poll",): "no polling level",
    ("--prio",): "no process priority",
    ("-rpc", "--rpc"): "no RPC backend (strata ring spreads a model over machines)",
    ("-embd", "--embeddings"): "bench measures generation",
}


def _hidden(names: tuple[str, ...]) -> inspect.Parameter:
    return inspect.Parameter(_param(names), inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[str | None, Opt(*names, hidden=True)])


def _param(names: tuple[str, ...]) -> str:
    return "llama_bench_" + names[-1].lstrip("-").replace("-", "_")


def refuse_llama_bench_only(params: dict[str, Any]) -> None:
    for names, why in LLAMA_BENCH_ONLY.items():
        if params.pop(_param(names)) is not None:
            raise InputError(f"{'/'.join(names)}: a llama-bench option not supported by "
                             f"strata ({why}); leave it out")


# The flags are spelled once, in BenchFlags; the command's own are added here.
bench.__signature__, bench.__annotations__ = command_signature(BenchFlags, [  # type: ignore
    *(_hidden(names) for names in LLAMA_BENCH_ONLY),
    inspect.Parameter("fmt", inspect.Parameter.KEYWORD_ONLY, default="table", annotation=Annotated[
        str, Opt("--format", "-o", metavar="FORMAT", rich_help_panel="Output",
                 help=f"{', '.join(FORMATS_HELP)}.")]),
    inspect.Parameter("json_out", inspect.Parameter.KEYWORD_ONLY, default=False,
                      annotation=Annotated[bool, Opt("--json", rich_help_panel="Output",
                                                     help="Same as -o json.")]),
    inspect.Parameter("list_presets", inspect.Parameter.KEYWORD_ONLY, default=False,
                      annotation=Annotated[bool, Opt("--list-presets", help="List the synthetic "
                                                     "presets and exit.")]),
    inspect.Parameter("progress", inspect.Parameter.KEYWORD_ONLY, default=None,
                      annotation=Annotated[bool | None, Opt(
                          "--progress/--no-progress", show_default=False,
                          rich_help_panel="Output",
                          help="Progress on stderr: a live bar on a terminal, one line per "
                          "finished test otherwise.")]),
    inspect.Parameter("db", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=DbOption)])
app.command(context_settings={"help_option_names": ["-h", "--help"]})(bench)


def _print_presets() -> None:
    from rich.table import Table

    from strata.models.presets import default_model, list_presets

    t = Table(title=f"Synthetic presets (default {default_model()})", title_justify="left")
    for col in ("preset", "arch", "layers", "hidden", "heads/kv", "experts", "vocab",
                "source"):
        t.add_column(col)
    for p in list_presets():
        t.add_row(p.name, p.arch, str(p.n_layers), str(p.hidden),
                  f"{p.n_heads}/{p.n_kv_heads}", p.experts_label or "-", str(p.vocab), p.source)
    out.print(t)
    out.print("quantisations: @f32 @f16 @q8_0 @q4_0 (GGUF); torch runs the f16/f32 weights")
