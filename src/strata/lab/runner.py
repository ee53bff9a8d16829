"""A bound decode step as one list of steps, run by strata's C runner (`csrc/runner.c`).

A step is a bound lab kernel or glue between kernels (a residual or bias add, a K/V row
written into the cache). Each step can run from Python (`Step.call`: the bound thunk, or
the torch glue); most can also run natively: an in-process C kernel by its entry point and
ABI arguments, the glue as the runner's own add and K/V copy. `Program` groups consecutive
native steps into one array run by a single ctypes call, so a token costs a handful of
Python calls instead of ~13 per layer; the rest (a confined kernel's round trip to its
worker, torch's stand-in for an op, the MoE routing, any device but the CPU) runs from
Python in place, in the same order. The results are the same bit for bit: the same kernels
on the same buffers, and float32 adds in the same order as torch's add_.
"""

from __future__ import annotations

import ctypes
import functools
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from strata.engine import kvcache

RUNNER_SOURCE = Path(__file__).parent / "csrc" / "runner.c"
STEP_KERNEL, STEP_ADD, STEP_KV_STORE, STEP_KV_STORE_F16, STEP_KV_STORE_Q8_0 = 0, 1, 2, 3, 4
# the K/V cache type (strata.engine.kvcache) -> runner.c's step that writes a row of it
KV_STEPS = {"f32": STEP_KV_STORE, "f16": STEP_KV_STORE_F16, "q8_0": STEP_KV_STORE_Q8_0}
MAX_INTS, MAX_FLOATS = 16, 4  # csrc/runner.c's entry prototype
GLUE = "glue"  # Step.op of everything that is not a lab kernel


class _CStep(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int64), ("fn", ctypes.c_void_p),
                ("a", ctypes.c_int64 * MAX_INTS), ("f", ctypes.c_float * MAX_FLOATS)]


@dataclass(frozen=True)
class Native:
    """What the runner needs to take a step: its kind, entry point and arguments."""

    kind: int
    fn: int = 0
    ints: tuple[int, ...] = ()
    floats: tuple[float, ...] = ()
    name: str = ""  # the glue's name in the per-token counts


@dataclass(frozen=True)
class Step:
    op: str  # the lab op of a kernel step, GLUE otherwise
    call: Callable[[], Any]  # the step from Python
    native: Native | None = None  # None: Python only


def kernel_step(op: str, thunk: Callable[[], Any]) -> Step:
    """A bound kernel; native when the thunk is an in-process C kernel whose arguments fit
    the runner's prototype (`strata.kernels.dialects.c` tags those thunks)."""
    tag = getattr(thunk, "native", None)
    if tag is None:
        return Step(op, thunk)
    fn, ints, floats = tag
    if len(ints) > MAX_INTS or len(floats) > MAX_FLOATS:
        return Step(op, thunk)
    return Step(op, thunk, Native(STEP_KERNEL, fn, tuple(ints), tuple(floats)))


def _flat_f32_cpu(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
               for t in tensors)


def add_step(x: torch.Tensor, y: torch.Tensor) -> Step:
    """x += y (a residual or bias add)."""
    def call() -> None:
        x.add_(y)

    native = None
    if _flat_f32_cpu(x, y) and x.numel() == y.numel():
        native = Native(STEP_ADD, ints=(x.data_ptr(), y.data_ptr(), x.numel()), name="add")
    return Step(GLUE, call, native)


def kv_step(cache: torch.Tensor, src: torch.Tensor, at: torch.Tensor) -> Step:
    """src [heads, d] into cache [heads, rows, row(d)] (strata.engine.kvcache: float32;
    float16, rounded to nearest even; q8_0 blocks, quantised as ggml does) at the row held by
    at[0] (int64, read when the step runs: the position changes every token, the step does
    not)."""
    kind = kvcache.of(cache)

    def call() -> None:
        kind.store(cache[:, int(at[0])], src)

    heads, rows, _ = cache.shape
    d = src.numel() // max(1, heads)
    step = KV_STEPS.get(kind.name)
    native = None
    if step is not None and _flat_f32_cpu(src) and cache.device.type == "cpu" \
            and cache.is_contiguous() and src.numel() == heads * d \
            and cache.shape[2] == kind.row(d) and d % kind.block == 0 \
            and at.dtype == torch.int64 and at.device.type == "cpu":
        native = Native(step, ints=(cache.data_ptr(), src.data_ptr(), heads, rows, d,
                                    at.data_ptr()), name="kv_store")
    return Step(GLUE, call, native)


@functools.lru_cache(maxsize=1)
def _runner() -> Any:
    """strata_run from csrc/runner.c, built once per host (None without a compiler: every
    step then runs from Python)."""
    from strata.native import CompileError, load_shared

    try:
        fn = load_shared(RUNNER_SOURCE).strata_run
    except (CompileError, OSError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_void_p, ctypes.c_int64], ctypes.c_int64
    return fn


def _segment(steps: Sequence[Step], run: Any) -> Callable[[], None]:
    array = (_CStep * len(steps))()
    for slot, s in zip(array, steps, strict=True):
        assert s.native is not None
        slot.kind, slot.fn = s.native.kind, s.native.fn or None
        for i, v in enumerate(s.native.ints):
            slot.a[i] = v
        for i, v in enumerate(s.native.floats):
            slot.f[i] = v
    address, n = ctypes.addressof(array), len(steps)

    def call() -> None:
        failed = run(address, n)
        if failed >= 0:  # only a K/V row outside the cache refuses
            raise ValueError(f"decode step {steps[failed].op}: a K/V row outside the cache")

    call.array = array  # type: ignore[attr-defined]  # keep the steps alive
    return call


class Program:
    """Steps run in order: consecutive native ones as one runner call each."""

    def __init__(self, steps: Sequence[Step]) -> None:
        self.steps = list(steps)
        run = _runner()
        self.segments: list[Callable[[], Any]] = []
        pending: list[Step] = []
        for s in self.steps:
            if s.native is not None and run is not None:
                pending.append(s)
                continue
            if pending:
                self.segments.append(_segment(pending, run))
                pending = []
            self.segments.append(s.call)
        if pending:
            self.segments.append(_segment(pending, run))

    def __call__(self) -> None:
        for segment in self.segments:
            segment()

    def native_glue(self) -> Counter:
        """Glue the runner does per run, by name (what torch no longer sees)."""
        run = _runner()
        return Counter(s.native.name for s in self.steps
                       if run is not None and s.native is not None and s.op == GLUE)
