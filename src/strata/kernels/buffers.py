"""Buffers a candidate kernel is handed, built so that what it could exploit tells nothing.

- **Guarded tensors:** every input and output lives inside a larger allocation whose margins
  hold random bytes (canaries); a write past either end changes them.
- **Output prefills:** before each verification call the output holds NaN, zeros, random
  values, or the correct answer for a *different* input: a kernel that reads its output
  buffer to decide what to do (skip work when it looks already written) is wrong for one.
- **Fresh inputs for timed calls** (`InputStream`): each timed call gets inputs it has never
  seen (a random mix of pre-generated sets, written into one of two buffer slots), so a
  result cached by pointer, size, call count or a sample of values is stale.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from strata.kernels.checks import OUT_OF_BOUNDS, Failure
from strata.kernels.spec import KernelSpec

PREFILLS = ("nan", "zeros", "random", "other_answer")
MIN_MARGIN_BYTES = 4096
MAX_MARGIN_BYTES = 4 << 20
POOL_SETS = 4
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


def guarded_copy(t: Any) -> Guarded:
    """`t`'s values in a fresh allocation with canaries on both sides."""
    import torch

    item = t.element_size()
    margin = max(MIN_MARGIN_BYTES, min(MAX_MARGIN_BYTES, t.numel() * item // 4)) // item
    margin = max(1, margin)
    buffer = torch.empty(t.numel() + 2 * margin, dtype=t.dtype, device=t.device)
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

@dataclass
class Slot:
    """One set of buffers a timed call reads from and writes to."""

    inputs: list[Any]
    out: Any
    recipe: tuple[int, int, float, float] | None = None  # (set a, set b, alpha, beta)


@dataclass
class InputStream:
    """Fresh inputs per call: x = alpha*set_a + beta*set_b for floating inputs (integer and
    quantised inputs come from set_a), mixed into one of two slots, outputs poisoned."""

    spec: KernelSpec
    shape: dict[str, int]
    dtype: str
    device: str
    base_seed: int
    pool: list[list[Any]] = field(default_factory=list)
    slots: list[Slot] = field(default_factory=list)
    calls: int = 0

    def __post_init__(self) -> None:
        from strata.kernels.worker import nan_out

        self.pool = [self.spec.make_inputs(self.shape, self.dtype, self.base_seed + k,
                                           self.device) for k in range(POOL_SETS)]
        self.slots = [Slot([t.clone() for t in self.pool[0]],
                           nan_out(self.spec, self.shape, self.dtype, self.device))
                      for _ in range(2)]

    def slot(self, index: int) -> Slot:
        return self.slots[index % 2]

    def refresh(self) -> Slot:
        """New inputs into the next slot (outside any timed region); its output poisoned."""
        slot = self.slot(self.calls)
        self.calls += 1
        a, b = _RNG.randrange(POOL_SETS), _RNG.randrange(POOL_SETS)
        alpha, beta = _RNG.uniform(0.6, 1.4), _RNG.uniform(-0.5, 0.5)
        for dst, xa, xb in zip(slot.inputs, self.pool[a], self.pool[b], strict=True):
            if xa.is_floating_point():
                dst.copy_(xa).mul_(alpha).add_(xb, alpha=beta)
            else:
                dst.copy_(xa)
        if self.spec.derive is not None:  # dependent inputs follow the mixed ones
            self.spec.derive(slot.inputs, **self.spec.params_for(self.shape))
        slot.out.fill_(float("nan"))
        slot.recipe = (a, b, alpha, beta)
        return slot


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
        from strata.kernels.spec import Tolerance
        from strata.kernels.worker import oracle

        params = self.spec.params_for(self.shape)
        tol = self.spec.tolerance(self.dtype)
        if self.spec.flops(self.shape) <= ORACLE_FLOPS:
            return oracle(self.spec, slot.inputs, params), tol
        ref = self.spec.vendor()(*slot.inputs, **params)
        return ref, Tolerance(tol.atol * VENDOR_TOL_FACTOR, tol.rtol * VENDOR_TOL_FACTOR)

    def _wanted(self, force: bool) -> bool:
        if force or (self.spec.flops(self.shape) <= VENDOR_FLOPS and \
                self.spent_s < CHECK_BUDGET_S):
            return True
        p = self.sample_p if self.spent_s < CHECK_BUDGET_S else self.sample_p / 5
        return _RNG.random() < p

    def after_call(self, slot: Slot, index: int, force: bool = False) -> None:
        import time

        from strata.kernels import checks

        if self.failure is not None or slot.recipe is None or not self._wanted(force):
            return
        started = time.perf_counter()
        ref, tol = self._reference(slot)
        bad = checks.compare(slot.out, ref, tol)
        self.checked += 1
        self.spent_s += time.perf_counter() - started
        if bad:
            self.failure = f"timed call #{index + 1} was wrong ({bad.reason}: {bad.message})"


def rotating_thunk(stream: InputStream, bind: Callable[[Slot], Callable[[], object]],
                   checker: TimedOutputChecker | None, flush: Callable[[], None]) -> \
        tuple[Callable[[], object], Callable[[], None], Callable[[], None]]:
    """(timed thunk, untimed `before` hook, final check) for `time_calls`.

    `before` checks the previous call's output, refreshes the next slot's inputs, poisons
    its output and flushes the cache; the thunk calls the bound kernel of that slot.
    """
    thunks = [bind(stream.slot(0)), bind(stream.slot(1))]
    current = [0]

    def before() -> None:
        if checker is not None and stream.calls:
            checker.after_call(stream.slot(stream.calls - 1), stream.calls - 1)
        current[0] = stream.calls % 2
        stream.refresh()
        flush()

    def thunk() -> object:
        return thunks[current[0]]()

    def finish() -> None:
        if checker is not None and stream.calls:
            checker.after_call(stream.slot(stream.calls - 1), stream.calls - 1, force=True)

    return thunk, before, finish
