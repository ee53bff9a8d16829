"""`strata train`: a small Llama trained from scratch, exported to Hugging Face and GGUF.

Also the entry of `torchrun --nproc-per-node N -m strata.train ...` (strata.train.__main__):
every rank runs this command; rank 0 alone prints, probes the host and writes the DB.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from strata.cli import DbOption, app, err, open_store, out
from strata.cli.helptext import reflowed
from strata.cli.status import ProgressOption, use_progress
from strata.errors import InputError
from strata.train.presets import DEFAULT_PRESET, PRESETS
from strata.views.console import progress_enabled

Opt = typer.Option

_PRESETS = ", ".join(f"{n} ({p.model.hidden} wide, {p.model.n_layers} layers, ctx "
                     f"{p.model.ctx}, {p.steps} steps)" for n, p in PRESETS.items())
# Option panels: each is its own table, so its columns fit its own names (80 columns).
DATA, HARDWARE, RUN = "Model and data", "Hardware", "Run"
_FROM_CHECKPOINT = ("preset", "data", "batch", "accum", "seed", "out", "kernels", "dtype")


def _matmul(served: dict[str, Any] | None) -> str:
    """The projections' line: dispatch's choice for matmul (torch unless a lab kernel wins)."""
    if not served:
        return ""
    why = f": {served['why']}" if served.get("why") else ""
    return f"; matmul {served['impl']} ({served.get('outcome', '?')}{why})"


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Bar:
    """The progress bar on stderr: step n/N, loss, tokens/s, MFU, elapsed and ETA; a line
    per evaluation above it."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.shown = progress_enabled()  # --no-progress: no bar, no step lines
        self.bar = Progress(TextColumn("train", style="bold"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[stats]}", markup=False), TimeElapsedColumn(),
                            TextColumn("ETA {task.fields[eta]}", markup=False), console=err,
                            transient=True)
        self.task = self.bar.add_task("train", total=1, stats="", eta="?")

    def begin(self, steps: int, done: int) -> None:
        row = self.store.row
        m = row.model
        err.print(f"run {row.run_id}: preset {row.preset}, {row.params / 1e6:.2f}M parameters "
                  f"({m['n_layers']} layers x {m['hidden']}, vocab {m['vocab']}, ctx {m['ctx']}),"
                  f" {row.device} {row.dtype}, ops {row.kernels}, {row.world_size} process(es);"
                  f" {escape(row.out_dir)}" + (f"; resuming at step {done}" if done else ""),
                  highlight=False)
        self.bar.reset(self.task, total=steps, completed=done)  # elapsed from here
        if self.shown:
            self.bar.start()

    def step(self, s: Any) -> None:
        mfu = f" · MFU {100 * s.mfu:.2f}%" if s.mfu is not None else ""
        stats = f"loss {s.loss:.3f} · {s.tokens_per_s:,.0f} tok/s{mfu}"
        self.bar.update(self.task, completed=s.step, eta=_duration(s.eta_s), stats=stats)
        total = int(self.bar.tasks[0].total or 0)
        # A log or pipe gets no live bar: a plain line every tenth of the run instead.
        if self.shown and not err.is_terminal and total and (
                s.step % max(1, total // 10) == 0 or s.step == total):
            err.print(f"step {s.step}/{total}: {stats} · ETA {_duration(s.eta_s)}",
                      highlight=False)

    def evaluated(self, e: Any) -> None:
        self.bar.console.print(f"step {e.step}: validation loss {e.loss:.3f}, "
                               f"{e.bits_per_byte:.3f} bits/byte", highlight=False)

    def close(self) -> None:
        self.bar.stop()


def _default_kernels(args: dict[str, Any]) -> str:
    """The lab's CPU training kernels are float32 (c dialect); elsewhere the torch twin."""
    cpu = str(args["device"]).startswith("cpu")
    return "lab" if cpu and (args["dtype"] or "float32") == "float32" else "torch"


def _config(args: dict[str, Any], world: Any, db: Path | None) -> tuple[Any, Any]:
    """The TrainConfig (from the flags, or from the checkpoint with --resume) and the
    resumed checkpoint."""
    from strata.train.run import TrainConfig, find_resume, preset_named

    if args["resume"] is None:
        preset = preset_named(args["preset"] or DEFAULT_PRESET,
                              **{k: args[k] for k in ("steps", "batch", "accum", "eval_every",
                                                      "ckpt_every")})
        return TrainConfig(preset, data=args["data"] or None, device=args["device"],
                           dtype=args["dtype"] or "float32",
                           kernels=args["kernels"] or _default_kernels(args),
                           seed=args["seed"] or 0, out=args["out"], threads=args["threads"],
                           export=args["export"]), None
    resumed = find_resume(args["resume"], open_store(db))
    given = [k for k in _FROM_CHECKPOINT if args[k] not in (None, [])]
    if given:
        raise InputError(f"--{given[0].replace('_', '-')}: a resumed run keeps its own (it comes "
                         "from the checkpoint); give only --steps, --device, --threads")
    cfg = TrainConfig.from_dict(resumed.checkpoint.config)
    steps = args["steps"] if args["steps"] is not None else cfg.preset.steps
    if steps <= resumed.checkpoint.step:
        raise InputError(f"--resume {args['resume']}: the run has done {resumed.checkpoint.step}"
                         f" of {steps} steps; give --steps above {resumed.checkpoint.step} to "
                         "train it further")
    cfg.preset = replace(cfg.preset, steps=steps, eval_every=args["eval_every"] or
                         cfg.preset.eval_every, ckpt_every=args["ckpt_every"] or
                         cfg.preset.ckpt_every)
    cfg.device, cfg.threads, cfg.resume = args["device"], args["threads"], args["resume"]
    cfg.export = args["export"]
    return cfg, resumed


def _peak(conn: Any, device: Any, dtype: str) -> tuple[Any, tuple[float | None, str]]:
    """This host (probed) and the measured matmul peak MFU is against (measured once and
    stored when the host has no roofline yet)."""
    from strata.host import this_host

    host = this_host(conn, err)
    roof = host.roofline(err)
    from strata.hardware.devices import key_for

    key = key_for(device)
    dev = roof.device(key)
    name = {"float32": "fp32", "bfloat16": "bf16"}[dtype]
    gflops = dev.peak_gflops(name) if dev else None
    if not gflops:
        return host, (None, f"no measured {name} matmul peak for {key}")
    return host, (gflops * 1e9, f"{name} matmul {gflops:,.1f} GFLOP/s on {key}, measured: "
                                f"{dev.compute[name].method}")


def _print_result(r: Any) -> None:
    lines = [f"run {r.run_id}: {r.step:,} steps, {r.params / 1e6:.2f}M parameters, "
             f"{_duration(r.train_s)} of training"]
    if r.val_loss is not None:
        lines.append(f"validation loss {r.val_loss:.4f}, {r.bits_per_byte:.4f} bits per byte")
    if r.tokens_per_s:
        mfu = (f", MFU {100 * r.mfu:.2f}% of the {r.peak_basis}" if r.mfu is not None
               else f", MFU unknown ({r.peak_basis})")
        lines.append(f"{r.tokens_per_s:,.0f} tokens/s{mfu}")
    hot = {op: v for op, v in r.ops.items() if op != "matmul"}
    impls = sorted({v['impl'] for v in hot.values()})
    lines.append("ops: " + (f"all {impls[0]}" if len(impls) == 1 else ", ".join(
        f"{op} {v['impl']}" + (f" ({v['outcome']})" if v.get("outcome") else "")
        for op, v in hot.items())) + _matmul(r.ops.get("matmul")))
    if r.sample is not None:
        lines.append(f"sample: {r.sample!r}")
    lines.append(f"folder: {r.folder}")
    lines += [f"{kind}: {path}" for kind, path in r.outputs.items()]
    if r.commands:
        lines.append("next:")
        lines += [f"  {c}" for c in r.commands]
    for line in lines:
        out.print(line, highlight=False, markup=False, soft_wrap=True)


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
        help="Save a checkpoint every N steps (and on Ctrl-C).")] = None,
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
    from strata.train.distributed import world_from_env
    from strata.train.run import check, load_documents, make_ops
    from strata.train.run import train as run_train

    args = dict(locals())
    use_progress(args.pop("progress"))
    args["out"] = args.pop("out_dir")
    world = world_from_env()
    cfg, resumed = _config(args, world, db)
    dev = check(cfg)
    # rank 0 records the run; every rank reads kernel verdicts for lab ops
    conn = open_store(db) if world.main or cfg.kernels != "torch" else None
    ops = make_ops(cfg.kernels, dev, conn)
    docs = None if resumed else load_documents(cfg)
    store, peak, bar = None, (None, ""), None
    if world.main:
        from strata.store.training import TrainRecorder

        host, peak = _peak(conn, dev, cfg.dtype)
        store = TrainRecorder(conn, host.fingerprint, ["strata", *sys.argv[1:]])
        bar = Bar(store)
    from strata.train.loop import Quiet

    try:
        result = run_train(cfg, ops, bar or Quiet(), store, resumed, peak, world, docs)
    finally:
        if bar:
            bar.close()
    if not world.main:
        return
    if not result.completed:
        err.print(f"interrupted at step {result.step:,} of {result.steps:,}: checkpoint "
                  f"saved in {result.folder}; continue with: strata train --resume "
                  f"{result.run_id}", highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(130)
    _print_result(result)
