"""`strata bench`: its flags live in commands/bench_options.py (BenchFlags), its work in
commands/bench.py; this file only binds them to the CLI."""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from strata.cli import DbOption, app, err, open_store, out
from strata.commands.bench_options import (
    FORMATS_HELP,
    BenchFlags,
    build_config,
    command_signature,
)
from strata.errors import InputError

Opt = typer.Option


def bench(**params: Any) -> None:
    """How fast a model runs here, on llama.cpp, PyTorch or a server, and why (the roofline).

    Tests follow llama-bench: pp<N> prompt processing, tg<M> generation, pp<N>+tg<M>, each
    optionally @d<D> after D tokens of context. Lists and ranges sweep (-p 128,512 -t 1-2).
    Every result is stored with the host, versions, full config and raw samples.

    [bold]Examples[/bold]
      strata bench                                   [dim]# embedded synthetic preset[/dim]
      strata bench synthetic:qwen2.5-0.5b@q4_0 -p 128,512 -n 64
      strata bench model.gguf -B llamacpp -t 1-2 -d 0,1024 -o md
      strata bench http://127.0.0.1:8080 --model-name my-model -p 256 -n 64
    """
    from strata.commands.bench import print_outcome, run_bench

    fmt, list_presets, db = params.pop("fmt"), params.pop("list_presets"), params.pop("db")
    if list_presets:
        _print_presets()
        return
    if fmt not in FORMATS_HELP:
        raise InputError(f"--format {fmt}: choose one of {', '.join(FORMATS_HELP)}")
    config = build_config(BenchFlags(**params))
    outcome = run_bench(open_store(db), config, err)
    print_outcome(outcome, fmt, out, err)
    if outcome.status == "incomplete":
        raise typer.Exit(130)


# The flags are spelled once, in BenchFlags; the command's own are added here.
bench.__signature__, bench.__annotations__ = command_signature(BenchFlags, [  # type: ignore
    inspect.Parameter("fmt", inspect.Parameter.KEYWORD_ONLY, default="table", annotation=Annotated[
        str, Opt("--format", "-o", help=f"{', '.join(FORMATS_HELP)}.")]),
    inspect.Parameter("list_presets", inspect.Parameter.KEYWORD_ONLY, default=False,
                      annotation=Annotated[bool, Opt("--list-presets", help="List the synthetic "
                                                     "presets and exit.")]),
    inspect.Parameter("db", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=DbOption)])
app.command(context_settings={"help_option_names": ["-h", "--help"]})(bench)


def _print_presets() -> None:
    from rich.table import Table

    from strata.models.presets import default_model, list_presets

    t = Table(title=f"Synthetic presets (default {default_model()})", title_justify="left")
    for col in ("preset", "arch", "layers", "hidden", "heads/kv", "vocab", "source"):
        t.add_column(col)
    for p in list_presets():
        t.add_row(p.name, p.arch, str(p.n_layers), str(p.hidden),
                  f"{p.n_heads}/{p.n_kv_heads}", str(p.vocab), p.source)
    out.print(t)
    out.print("quantisations: @f32 @f16 @q8_0 @q4_0 (GGUF); torch runs the f16/f32 weights")
