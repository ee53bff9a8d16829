"""The training loop: AdamW on warmup + cosine, gradient clipping and accumulation,
periodic validation (loss and bits per byte), checkpoints every N steps and on Ctrl-C, and
the figures a progress bar shows (loss, tokens/s, MFU, ETA).

Ctrl-C (SIGINT, or SIGTERM from torchrun) only raises a flag; the loop looks at it between
optimizer steps, so a checkpoint always holds a whole step: the model, the optimizer and the
data position agree, and a resumed run computes the same losses as one that never stopped.
A second Ctrl-C interrupts at once (no checkpoint).
"""

from __future__ import annotations

import math
import signal
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from strata.measure.timer import HostClock
from strata.train import distributed as ddp
from strata.train.checkpoint import Checkpoint, History, rng_state, save_checkpoint
from strata.train.presets import TrainPreset
from strata.train.schedule import Schedule

SPEED_WINDOW = 20  # steps: tokens/s and the ETA are over the latest ones (the first are slow)
BETAS = (0.9, 0.95)  # nanoGPT / Llama


@dataclass
class StepStats:
    step: int  # optimizer steps done
    steps: int
    loss: float
    lr: float
    tokens_per_s: float
    mfu: float | None
    elapsed_s: float
    eta_s: float


@dataclass
class EvalStats:
    step: int
    loss: float
    bits_per_byte: float


class Progress(Protocol):
    """What the user sees (rank 0); a `Quiet` one elsewhere."""

    def begin(self, steps: int, done: int) -> None: ...

    def step(self, s: StepStats) -> None: ...

    def evaluated(self, e: EvalStats) -> None: ...


class Recorder(Protocol):
    """Where figures go as they happen (the DB on rank 0)."""

    def step(self, s: StepStats) -> None: ...

    def evaluated(self, e: EvalStats) -> None: ...

    def checkpointed(self, loop: Loop, path: Path) -> None: ...


class Quiet:
    def begin(self, steps: int, done: int) -> None: ...

    def step(self, s: StepStats) -> None: ...

    def evaluated(self, e: EvalStats) -> None: ...

    def checkpointed(self, loop: Loop, path: Path) -> None: ...


class StopFlag:
    """Set by SIGINT/SIGTERM while installed; the second signal interrupts at once."""

    def __init__(self) -> None:
        self.requested = False
        self._old: dict[int, Any] = {}

    def _handle(self, signum: int, frame: object) -> None:
        self.requested = True
        signal.signal(signum, self._old.get(signum, signal.SIG_DFL))  # next one: default

    @contextmanager
    def installed(self) -> Iterator[StopFlag]:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old[sig] = signal.signal(sig, self._handle)
        try:
            yield self
        finally:
            for sig, old in self._old.items():
                signal.signal(sig, old)


def make_optimizer(model: torch.nn.Module, preset: TrainPreset) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (norm gains are not decayed)."""
    params = list(model.parameters())  # shared (tied) parameters appear once
    groups = [{"params": [p for p in params if p.ndim >= 2], "weight_decay": preset.weight_decay},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=preset.lr, betas=BETAS, eps=1e-8)


@dataclass
class Loop:
    """One rank's training state and the step, evaluation and checkpoint around it."""

    model: torch.nn.Module  # the raw model (weights, export, evaluation)
    trainable: torch.nn.Module  # the model or its DDP wrapper (training forward/backward)
    optimizer: torch.optim.Optimizer
    preset: TrainPreset
    batches: Any  # strata.train.data.Batches: next(), state(), restore()
    val_batches: Callable[[], list[tuple[torch.Tensor, torch.Tensor]]]
    val_bytes_per_token: float
    world: ddp.World
    device: torch.device
    autocast_dtype: torch.dtype | None  # bfloat16 mixed precision, or None (float32)
    flops_per_token: float
    peak_flops: float | None  # FLOP/s the MFU is against (None: no measured peak)
    folder: Path | None  # where rank 0 writes checkpoints
    config: dict[str, Any]  # stored in each checkpoint
    step: int = 0
    tokens_seen: int = 0
    elapsed_s: float = 0.0  # training time (steps only), over every session of the run
    history: History = field(default_factory=History)
    run_id: int = 0
    stop: StopFlag = field(default_factory=StopFlag)
    _times: deque = field(default_factory=lambda: deque(maxlen=SPEED_WINDOW))

    @property
    def schedule(self) -> Schedule:
        return Schedule(self.preset.lr, self.preset.warmup, self.preset.steps)

    @property
    def tokens_per_step(self) -> int:
        """All ranks and micro-steps together."""
        p = self.preset
        return p.batch * p.accum * p.model.ctx

    def _autocast(self) -> AbstractContextManager:
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def _sync(self) -> None:
        from strata.hardware.devices import sync

        sync(self.device)

    def train_step(self) -> float:
        """One optimizer step over `accum` micro-batches; the loss averaged over them and
        over the ranks (the loss of the global batch)."""
        lr = self.schedule(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total = torch.zeros((), device=self.device)
        accum = self.preset.accum
        for micro in range(accum):
            x, y = (t.to(self.device) for t in self.batches.next())
            # DDP all-reduces gradients in backward; only the last micro-step needs it
            last = micro == accum - 1
            sync = nullcontext() if last or not self.world.parallel else self.trainable.no_sync()
            with sync:
                with self._autocast():
                    _, loss = self.trainable(x, y)
                (loss / accum).backward()
            total += loss.detach().float()
        if self.preset.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.preset.grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(ddp.mean(self.world, total / accum).item())

    def stats(self, loss: float, seconds: float) -> StepStats:
        self._times.append(seconds)
        mean_s = sum(self._times) / len(self._times)
        tps = self.tokens_per_step / mean_s if mean_s > 0 else 0.0
        mfu = tps * self.flops_per_token / self.peak_flops if self.peak_flops else None
        return StepStats(self.step, self.preset.steps, loss, self.schedule(self.step - 1), tps,
                         mfu, self.elapsed_s, (self.preset.steps - self.step) * mean_s)

    @torch.no_grad()
    def evaluate(self) -> EvalStats:
        """Mean loss over the fixed validation batches (each rank its rows, then averaged);
        bits per byte = loss / ln 2 / (UTF-8 bytes per token)."""
        self.model.eval()
        losses = []
        for x, y in self.val_batches():
            with self._autocast():
                _, loss = self.model(x.to(self.device), y.to(self.device))
            losses.append(loss.float())
        self.model.train()
        value = float(ddp.mean(self.world, torch.stack(losses).mean()).item())
        bpb = value / math.log(2) / self.val_bytes_per_token
        self.history.val.append([self.step, value, bpb])
        return EvalStats(self.step, value, bpb)

    def checkpoint(self) -> Checkpoint:
        return Checkpoint(step=self.step, model=self.model.state_dict(),
                          optimizer=self.optimizer.state_dict(), data=self.batches.state(),
                          rng=rng_state(self.device), config=self.config,
                          history=self.history, tokens_seen=self.tokens_seen,
                          elapsed_s=self.elapsed_s, run_id=self.run_id)

    def restore(self, ckpt: Checkpoint) -> None:
        from strata.train.checkpoint import restore_rng

        self.model.load_state_dict(ckpt.model)
        self.optimizer.load_state_dict(ckpt.optimizer)
        self.batches.restore(ckpt.data)
        restore_rng(ckpt.rng, self.device)
        self.step, self.tokens_seen, self.elapsed_s = ckpt.step, ckpt.tokens_seen, ckpt.elapsed_s
        self.history = ckpt.history

    def save(self, recorder: Recorder) -> Path | None:
        """Rank 0 writes the checkpoint; the other ranks hold the same state."""
        if not self.world.main or self.folder is None:
            return None
        path = save_checkpoint(self.folder, self.checkpoint())
        recorder.checkpointed(self, path)
        return path

    def _timed_step(self, clock: HostClock) -> tuple[float, float]:
        out: list[float] = []
        return clock.measure(lambda: out.append(self.train_step())), out[0]

    def run(self, progress: Progress, recorder: Recorder) -> bool:
        """Train up to preset.steps; False when stopped by a signal (after a checkpoint)."""
        p = self.preset
        clock = HostClock(self._sync)
        progress.begin(p.steps, self.step)
        self.model.train()
        with self.stop.installed():
            while self.step < p.steps:
                if ddp.any_rank(self.world, self.stop.requested, self.device):
                    self.save(recorder)
                    return False
                seconds, loss = self._timed_step(clock)
                self.step += 1
                self.tokens_seen += self.tokens_per_step
                self.elapsed_s += seconds
                self.history.train.append([self.step, loss, self.schedule(self.step - 1)])
                s = self.stats(loss, seconds)
                progress.step(s)
                recorder.step(s)
                if self.step % p.eval_every == 0 or self.step == p.steps:
                    e = self.evaluate()
                    progress.evaluated(e)
                    recorder.evaluated(e)
                if self.step % p.ckpt_every == 0 or self.step == p.steps:
                    self.save(recorder)
        return True
