"""The learning-rate schedule: linear warmup, then cosine decay to a floor.

A pure function of the step, so the schedule needs no state of its own: a checkpoint's step
restores it exactly (nanoGPT's `get_lr`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_LR_RATIO = 0.1  # the cosine ends at 10% of the peak (nanoGPT, Chinchilla)


@dataclass(frozen=True)
class Schedule:
    lr: float  # the peak
    warmup: int  # steps of linear warmup
    total: int  # optimizer steps in the whole run
    min_ratio: float = MIN_LR_RATIO

    def __call__(self, step: int) -> float:
        """The learning rate of optimizer step `step` (0-based)."""
        floor = self.lr * self.min_ratio
        if step < self.warmup:
            return self.lr * (step + 1) / self.warmup
        if step >= self.total:
            return floor
        span = max(self.total - self.warmup, 1)
        progress = (step - self.warmup) / span
        return floor + 0.5 * (1.0 + math.cos(math.pi * progress)) * (self.lr - floor)
