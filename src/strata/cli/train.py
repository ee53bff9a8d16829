"""`strata train`: a small Llama trained from scratch, exported to Hugging Face and GGUF.

Also the entry of `torchrun --nproc-per-node N -m strata.train ...` (strata.train.__main__):
every rank runs this command; rank 0 alone prints, probes the host and writes the DB.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from strata.cli import DbOption, app, err, out
from strata.cli.helptext import reflowed
from strata.cli.status import ProgressOption, use_progress
from strata.train.presets import DEFAULT_PRESET, PRESETS

Opt = typer.Option

_PRESETS = ", ".join(f"{n} ({p.model.hidden} wide, {p.model.n_layers} layers, ctx "
                     f"{p.model.ctx}, {p.steps} steps)" for n, p in PRESETS.items())
# Option panels: each is its own table, so its columns fit its own names (80 columns).
DATA, HARDWARE, RUN = "Model and data", "Hardware", "Run"


@app.command()
@reflowed
def train(
    data: Annotated[list[Path] | None, Opt(
        "--data", metavar="PATH", rich_help_panel=DATA, show_default=False,
        help="Text files or folders to train on (repeatable; every UTF-8 file under a folder). "
        "Default: the embedded corpus (CPython's pydoc topics and standard-library docstrings, "
        "~2 MB, offline).")] = None,
    preset: Annotated[str | None, Opt(
        rich_help_panel=DATA, show_default=False,
        help=f"Model and schedule size: {_PRESETS}. Default {DEFAULT_PRESET}.")] = None,
    steps: Annotated[int | None, Opt(
        rich_help_panel=DATA, show_default=False,
        help="Optimizer steps (default: the preset's; with --resume: the new total).")] = None,
    batch: Annotated[int | None, Opt(
        rich_help_panel=DATA, show_default=False,
        help="Sequences per micro-step, all processes together (default: the preset's).")]
    = None,
    accum: Annotated[int | None, Opt(
        rich_help_panel=DATA, show_default=False,
        help="Micro-steps of gradient accumulation in each optimizer step.")] = None,
    seed: Annotated[int | None, Opt(
        rich_help_panel=DATA, show_default=False,
        help="Seed of the split, the initial weights and the batches (default 0).")] = None,
    device: Annotated[str, Opt(rich_help_panel=HARDWARE, help="cpu, cuda or cuda:N.")] = "cpu",
    dtype: Annotated[str | None, Opt(
        rich_help_panel=HARDWARE, show_default=False,
        help="float32 (default) or bfloat16 (mixed precision, float32 weights).")] = None,
    kernels: Annotated[str | None, Opt(
        rich_help_panel=HARDWARE, show_default=False,
        help="Ops of the model: lab (the kernel lab's verified kernels) or torch (plain "
        "PyTorch, the parity twin). Default: lab for float32 on the CPU (its C kernels are "
        "float32), else torch.")] = None,
    threads: Annotated[int | None, Opt(
        rich_help_panel=HARDWARE, show_default=False,
        help="CPU threads of torch and of the lab kernels' OpenMP team (default: "
        "OMP_NUM_THREADS if set, else the physical cores; under torchrun the cores shared by "
        "the ranks).")]
    = None,
    eval_every: Annotated[int | None, Opt(
        metavar="N", rich_help_panel=RUN, show_default=False,
        help="Validate every N steps.")] = None,
    ckpt_every: Annotated[int | None, Opt(
        metavar="N", rich_help_panel=RUN, show_default=False,
        help="Save every N steps (and at Ctrl-C).")] = None,
    out_dir: Annotated[Path | None, Opt(
        "--out", metavar="DIR", rich_help_panel=RUN, show_default=False,
        help="Run folder; default $STRATA_HOME/train/run-<id> (a new folder per run).")]
    = None,
    resume: Annotated[str | None, Opt(
        metavar="RUN", rich_help_panel=RUN, show_default=False,
        help="Continue run RUN (its id, or its folder) from its checkpoint.")] = None,
    export: Annotated[bool, Opt(
        "--export/--no-export", rich_help_panel=RUN,
        help="Write the Hugging Face folder and the GGUF at the end.")] = True,
    progress: ProgressOption = None,
    db: DbOption = None,
) -> None:
    """Train a small Llama from scratch, then export it (Hugging Face + GGUF) for bench and
    quality.

    AdamW with warmup + cosine, clipping, gradient accumulation; validation loss and bits
    per byte; a progress bar with loss, tokens/s, MFU (against this host's measured matmul
    peak) and ETA; checkpoints every N steps and on Ctrl-C (resume exactly with --resume).
    The run, its loss curve and its outputs are stored; `strata report` draws the curves.
    Data-parallel: torchrun --nproc-per-node 2 -m strata.train \\[same flags].

    [bold]Examples[/bold]
      strata train                       [dim]# embedded corpus, preset tiny, cpu[/dim]
      strata train --data ~/notes --preset small --steps 2000
      strata train --resume 7            [dim]# after Ctrl-C[/dim]
    """
    from strata.commands.train import run
    from strata.views.train import Bar, result_lines

    args = dict(locals())
    use_progress(args.pop("progress"))
    args["out"] = args.pop("out_dir")
    result = run(args, db, err, lambda store: Bar(store, err))
    if result is None:  # not rank 0: it prints nothing
        return
    if not result.completed:
        err.print(f"interrupted at step {result.step:,} of {result.steps:,}: checkpoint "
                  f"saved in {result.folder}; continue with: strata train --resume "
                  f"{result.run_id}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(130)
    for line in result_lines(result):
        out.print(line, highlight=False, markup=False, soft_wrap=True)
