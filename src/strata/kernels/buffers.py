"""Buffers a candidate kernel is handed, built so that what it could exploit tells nothing.

- **Guarded tensors:** every input and output lives inside a larger allocation whose margins
  hold random bytes (canaries); a write past either end changes them.
- **Output prefills:** before each verification call the output holds NaN, zeros, random
  values, or the correct answer for a *different* input: a kernel that reads its output
  buffer to decide what to do (skip work when it looks already written) is wrong for one.
- **Fresh inputs for timed calls** (`InputStream`): each timed call gets inputs it has never
  seen — windows at OS-random offsets of generated pools, mixed with random factors — so a
  result cached by pointer, size, call count, a sample of values or a span of earlier
  inputs is stale.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from strata.kernels.checks import OUT_OF_BOUNDS, Failure
from strata.kernels.spec import KernelSpec

PREFILLS = ("nan", "zeros", "random", "other_answer")
MIN_MARGIN_BYTES = 4096
MAX_MARGIN_BYTES = 4 << 20
_RNG = random.SystemRandom()  # not in the process's memory as a predictable state


@dataclass
class Guarded:
    """A contiguous tensor view inside a buffer with random canary margins."""

    view: Any
    buffer: Any
    margin: int  # elements on each side
    canary: Any  # copy of the margins as written

    def intact(self) -> bool:
        import torch

        now = torch.cat([self.buffer[:self.margin], self.buffer[-self.margin:]])
        return bool(torch.equal(now.view(torch.uint8), self.canary.view(torch.uint8)))


def guarded_copy(t: Any, alloc: Any) -> Guarded:
    """`t`'s values in a fresh shared-memory allocation (`alloc`: an Arena) with canaries
    on both sides."""
    import torch

    item = t.element_size()
    margin = max(MIN_MARGIN_BYTES, min(MAX_MARGIN_BYTES, t.numel() * item // 4)) // item
    margin = max(1, margin)
    buffer = alloc.empty((t.numel() + 2 * margin,), t.dtype)
    raw = buffer.view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, device=t.device))
    view = buffer[margin:margin + t.numel()].view(t.shape)
    view.copy_(t)
    canary = torch.cat([buffer[:margin], buffer[-margin:]]).clone()
    return Guarded(view, buffer, margin, canary)


def check_canaries(named: dict[str, Guarded]) -> Failure | None:
    hit = [name for name, g in named.items() if not g.intact()]
    if hit:
        return Failure(OUT_OF_BOUNDS, f"the kernel wrote outside {', '.join(hit)} (the canary "
                       "bytes around the buffer changed)")
    return None


def prefill(out: Any, mode: str, other: Any | None) -> None:
    """Fill an output before a call; `other` is the correct answer for different inputs."""
    import torch

    if mode == "nan" or (mode == "other_answer" and other is None):
        out.fill_(float("nan") if mode == "nan" else 0.5)
    elif mode == "zeros":
        out.zero_()
    elif mode == "random":
        out.copy_(torch.randn(out.shape, dtype=torch.float32).to(out.dtype))
    else:
        out.copy_(other.to(out.dtype))


# -- fresh inputs for timed calls --------------------------------------------------------------

POOL_SETS = 3  # generated sets per input: one per distribution (normal, uniform, heavy)
MIX_MAX_ELEMENTS = 1 << 22  # above this a float input is one scaled window, not a mix of two


@dataclass
class Slot:
    """One set of shared-memory buffers a timed call reads from and writes to."""

    inputs: list[Any]
    out: Any
    recipe: tuple[int, ...] | None = None  # the windows and factors of its current inputs
    probes: list[tuple[Any, Any]] = field(default_factory=list)  # (index, values) per input


@dataclass
class InputStream:
    """Inputs no kernel can predict or cache against: each refresh writes, into a slot,
    windows at random offsets of per-input pools (several generated sets end to end, from
    seeds drawn from the OS after the kernel was loaded), floating inputs as
    alpha*window_1 + beta*window_2 with random factors — no small basis to answer from.
    Integer and quantised inputs are windows too (quantised ones at row boundaries, so every
    block stays a valid block). The offsets come from the OS's random source, which no
    process state reveals."""

    spec: KernelSpec
    shape: dict[str, int]
    dtype: str
    alloc: Any  # Arena: slots live in shared memory
    slots_n: int = 2
    pools: list[Any] = field(default_factory=list)
    slots: list[Slot] = field(default_factory=list)
    calls: int = 0

    def __post_init__(self) -> None:
        from strata.kernels.judge import nan_out

        base = 3 * _RNG.randrange(1 << 20)  # base % 3 == 0: the sets cycle distributions
        sets = [self.spec.make_inputs(self.shape, self.dtype, base + k, "cpu")
                for k in range(POOL_SETS)]
        self.pools = [_pool([s[i] for s in sets]) for i in range(len(sets[0]))]
        self.slots = [Slot([self.alloc.copy(t) for t in sets[0]],
                           nan_out(self.spec, self.shape, self.dtype, self.alloc))
                      for _ in range(self.slots_n)]

    def slot(self, index: int) -> Slot:
        return self.slots[index % len(self.slots)]

    def refresh(self, index: int | None = None) -> Slot:
        """New inputs into a slot (outside any timed region); its output poisoned; a random
        sample of its inputs remembered, to check later that the kernel left them alone."""
        slot = self.slot(self.calls if index is None else index)
        self.calls += 1
        recipe: list[int] = []
        for dst, pool in zip(slot.inputs, self.pools, strict=True):
            recipe += _window_into(dst, pool)
        if self.spec.derive is not None:  # dependent inputs follow the mixed ones
            self.spec.derive(slot.inputs, **self.spec.params_for(self.shape))
        slot.out.fill_(float("nan"))
        slot.recipe = tuple(recipe)
        slot.probes = [_probe(t) for t in slot.inputs]
        return slot


def _pool(sets: list[Any]) -> Any:
    """The generated sets of one input, flattened end to end (rows kept whole)."""
    import torch

    return torch.cat([t.reshape(-1) for t in sets])


def _unit(dst: Any) -> int:
    """Offsets of a window are multiples of this: a whole row for integer tensors, whose
    rows are records (quantised uint8 blocks, attention_window's pos = [P, W], a conv's
    geom = [S, P]: a window across two records would swap their fields); 1 for floats."""
    return 1 if dst.is_floating_point() or dst.dim() == 0 else dst.shape[-1]


def _offset(pool: Any, n: int, unit: int) -> int:
    spare = (pool.numel() - n) // unit
    return unit * _RNG.randrange(spare + 1)


def _window_into(dst: Any, pool: Any) -> list[int]:
    n, unit = dst.numel(), _unit(dst)
    flat = dst.view(-1)
    o1 = _offset(pool, n, unit)
    if not dst.is_floating_point():
        flat.copy_(pool[o1:o1 + n])
        return [o1]
    alpha = _RNG.uniform(0.6, 1.4)
    if n > MIX_MAX_ELEMENTS:
        flat.copy_(pool[o1:o1 + n]).mul_(alpha)
        return [o1]
    o2 = _offset(pool, n, unit)
    beta = _RNG.uniform(-0.5, 0.5)
    flat.copy_(pool[o1:o1 + n]).mul_(alpha).add_(pool[o2:o2 + n], alpha=beta)
    return [o1, o2]


PROBE_ELEMENTS = 4096


def _probe(t: Any) -> tuple[Any, Any]:
    """Random positions of `t` and their values now (a kernel cannot know which)."""
    import torch

    flat = t.view(-1)
    k = min(PROBE_ELEMENTS, flat.numel())
    gen = torch.Generator().manual_seed(_RNG.randrange(1 << 62))
    idx = torch.randint(0, flat.numel(), (k,), generator=gen)
    return idx, flat[idx].clone()


def probes_intact(slot: Slot) -> bool:
    """The remembered input samples still hold (NaN-safe, bitwise)."""
    from strata.kernels.checks import same_values

    return all(same_values(t.view(-1)[idx], vals)
               for t, (idx, vals) in zip(slot.inputs, slot.probes, strict=True))


ORACLE_FLOPS = 5e7  # below this the float64 oracle is cheap enough for every timed call
VENDOR_FLOPS = 2e9  # below this the vendor path (in the op's dtype) checks every call
VENDOR_TOL_FACTOR = 4.0  # candidate vs vendor: both carry their own rounding error
CHECK_BUDGET_S = 10.0  # after this much checking, keep sampling at a low rate


@dataclass
class TimedOutputChecker:
    """Checks outputs of timed calls after each call returned: every call where a reference
    is cheap, otherwise a random sample the kernel cannot predict (the choice is made after
    the call, from the OS's random source)."""

    spec: KernelSpec
    shape: dict[str, int]
    dtype: str
    sample_p: float = 0.25
    checked: int = 0
    spent_s: float = 0.0
    failure: str | None = None

    def _reference(self, slot: Slot) -> tuple[Any, Any]:
        """(reference, tolerance) for this slot's inputs."""
        from strata.kernels.judge import oracle
        from strata.kernels.spec import Tolerance

        params = self.spec.params_for(self.shape)
        tol = self.spec.tolerance_for(self.dtype, slot.inputs)
        if self.spec.flops(self.shape) <= ORACLE_FLOPS:
            return oracle(self.spec, slot.inputs, params), tol
        ref = self.spec.vendor()(*slot.inputs, **params)
        return ref, Tolerance(tol.atol * VENDOR_TOL_FACTOR, tol.rtol * VENDOR_TOL_FACTOR,
                              tol.floor)

    def _wanted(self, force: bool) -> bool:
        if force or (self.spec.flops(self.shape) <= VENDOR_FLOPS and \
                self.spent_s < CHECK_BUDGET_S):
            return True
        p = self.sample_p if self.spent_s < CHECK_BUDGET_S else self.sample_p / 5
        return _RNG.random() < p

    def after_call(self, slot: Slot, index: int, force: bool = False) -> None:
        import time

        from strata.kernels import checks

        if self.failure is not None or slot.recipe is None:
            return
        if not probes_intact(slot):
            self.failure = f"timed call #{index + 1} wrote into its inputs (inputs are read-only)"
            return
        if not self._wanted(force):
            return
        started = time.perf_counter()
        ref, tol = self._reference(slot)
        bad = checks.compare(slot.out, ref, tol)
        self.checked += 1
        self.spent_s += time.perf_counter() - started
        if bad:
            self.failure = f"timed call #{index + 1} was wrong ({bad.reason}: {bad.message})"
