"""`strata train`'s printers: the progress bar (stderr) and the result's lines (stdout)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from strata.views.console import progress_enabled


def matmul_line(served: dict[str, Any] | None) -> str:
    """The projections' line: dispatch's choice for matmul (torch unless a lab kernel wins)."""
    if not served:
        return ""
    why = f": {served['why']}" if served.get("why") else ""
    return f"; matmul {served['impl']} ({served.get('outcome', '?')}{why})"


def duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class Bar:
    """The progress bar on stderr: step n/N, loss, tokens/s, MFU, elapsed and ETA; a line
    per evaluation above it."""

    def __init__(self, store: Any, err: Console) -> None:
        self.store, self.err = store, err
        self.shown = progress_enabled()  # --no-progress: no bar, no step lines
        self.bar = Progress(TextColumn("train", style="bold"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[stats]}", markup=False), TimeElapsedColumn(),
                            TextColumn("ETA {task.fields[eta]}", markup=False), console=err,
                            transient=True)
        self.task = self.bar.add_task("train", total=1, stats="", eta="?")

    def begin(self, steps: int, done: int) -> None:
        row = self.store.row
        m = row.model
        self.err.print(f"run {row.run_id}: preset {row.preset}, {row.params / 1e6:.2f}M parameters "
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
        self.bar.update(self.task, completed=s.step, eta=duration(s.eta_s), stats=stats)
        total = int(self.bar.tasks[0].total or 0)
        # A log or pipe gets no live bar: a plain line every tenth of the run instead.
        if self.shown and not self.err.is_terminal and total and (
                s.step % max(1, total // 10) == 0 or s.step == total):
            self.err.print(f"step {s.step}/{total}: {stats} · ETA {duration(s.eta_s)}",
                      highlight=False)

    def evaluated(self, e: Any) -> None:
        self.bar.console.print(f"step {e.step}: validation loss {e.loss:.3f}, "
                               f"{e.bits_per_byte:.3f} bits/byte", highlight=False)

    def close(self) -> None:
        self.bar.stop()


def result_lines(r: Any) -> list[str]:
    """What a finished run prints: figures, the ops that served it, its files, next steps."""
    lines = [f"run {r.run_id}: {r.step:,} steps, {r.params / 1e6:.2f}M parameters, "
             f"{duration(r.train_s)} of training"]
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
        for op, v in hot.items())) + matmul_line(r.ops.get("matmul")))
    if r.sample is not None:
        lines.append(f"sample: {r.sample!r}")
    lines.append(f"folder: {r.folder}")
    lines += [f"{kind}: {path}" for kind, path in r.outputs.items()]
    if r.commands:
        lines.append("next:")
        lines += [f"  {c}" for c in r.commands]
    return lines


