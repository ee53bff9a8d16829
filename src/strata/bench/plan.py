"""The sweep: models x backends x load configs x tests, ordered to minimise model reloads."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, fields, replace
from typing import Any

from strata.backends.base import LoadConfig
from strata.bench.scenario import BenchTest


@dataclass(frozen=True)
class RepPolicy:
    """Repetitions per docs/architecture.md §5: warm-up, then repeat to a CI target or a limit."""

    min_reps: int = 3
    max_reps: int = 10
    target_rel_ci: float = 0.02  # 95% CI half-width / mean of the test's primary metric
    max_time_s: float = 60.0  # per test, timed work only
    warmup: bool = True

    @classmethod
    def fixed(cls, n: int) -> RepPolicy:
        """`-r N`: exactly N timed repetitions, as llama-bench does."""
        return cls(min_reps=n, max_reps=n, target_rel_ci=0.0, max_time_s=float("inf"))


@dataclass
class BenchConfig:
    models: list[str]
    backends: list[str]
    tests: list[BenchTest]
    loads: list[LoadConfig]
    reps: RepPolicy = field(default_factory=RepPolicy)
    model_name: str | None = None
    delay_s: float = 0.0  # cool-down between tests
    sustained_s: float | None = None
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"models": self.models, "backends": self.backends,
                "tests": [t.name for t in self.tests],
                "loads": [vars(lc) for lc in self.loads], "reps": vars(self.reps),
                "model_name": self.model_name, "delay_s": self.delay_s,
                "sustained_s": self.sustained_s, "seed": self.seed}


@dataclass(frozen=True)
class Job:
    """One model load: everything run between a load and the next."""

    model: str
    backend: str
    load: LoadConfig
    tests: tuple[BenchTest, ...]


def load_grid(**lists: list[Any]) -> list[LoadConfig]:
    """Cartesian product of LoadConfig fields given as lists (empty/missing = default)."""
    names = [f.name for f in fields(LoadConfig)]
    unknown = set(lists) - set(names)
    if unknown:
        raise ValueError(f"unknown load fields {sorted(unknown)}")
    keys = [k for k in names if lists.get(k)]
    base = LoadConfig()
    return [replace(base, **dict(zip(keys, combo, strict=True)))
            for combo in itertools.product(*(lists[k] for k in keys))]


def plan(config: BenchConfig) -> list[Job]:
    """Loads are the expensive step: each (model, backend, load) is loaded once and runs all
    its tests. Tests run in llama-bench's order (pp, tg, pp+tg) from shallow to deep, so a
    model that cannot hold a long context fails after the short tests are stored."""
    kinds = {"pp": 0, "tg": 1, "pg": 2}
    ordered = tuple(sorted(config.tests, key=lambda t: (t.depth, kinds[t.kind], t.context)))
    return [Job(m, b, lc, ordered)
            for m in config.models for b in config.backends for lc in config.loads]
