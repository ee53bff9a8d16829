"""Which torch ops a step of the lab model runs, by class: compute, data movement, views.

The lab model's compute is meant to be lab kernels (called through ctypes or Triton, which
torch never sees); torch is only glue. This counts what torch actually ran during one call
with a `TorchDispatchMode` — every aten op reaches it — so the figure `-B lab` reports is
observed, not asserted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# aten ops that only describe memory (no element is read or written)
VIEWS = {"view", "_unsafe_view", "reshape", "transpose", "t", "slice", "select", "expand",
         "as_strided", "alias", "detach", "unsqueeze", "squeeze", "permute", "split",
         "unbind", "narrow", "lift_fresh", "_reshape_alias", "detach_",
         "to"}  # aten.to reaching dispatch is the no-copy case; a copy is _to_copy
ALLOCATIONS = {"empty", "empty_like", "empty_strided", "zeros", "new_empty", "new_zeros",
               "scalar_tensor", "full"}
# ops that move elements without arithmetic on them
MOVEMENT = {"copy_", "clone", "index_select", "cat", "fill_", "zero_", "_to_copy_same",
            "contiguous", "index", "embedding", "lift_fresh_copy"}


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        self.ops[_name(func, args, kwargs)] += 1
        return func(*args, **kwargs)


def _name(func: Any, args: tuple, kwargs: dict) -> str:
    name = func.overloadpacket.__name__
    if name == "_to_copy":  # a dtype conversion computes; a device/layout copy moves
        src = args[0] if args else None
        want = kwargs.get("dtype")
        if want is None or (isinstance(src, torch.Tensor) and src.dtype == want):
            return "_to_copy_same"
    return name


def classify(name: str) -> str:
    if name in VIEWS:
        return "view"
    if name in ALLOCATIONS:
        return "allocation"
    if name in MOVEMENT:
        return "movement"
    return "compute"


def torch_ops(step: Callable[[], Any]) -> dict[str, Counter]:
    """{class: Counter(aten op -> calls)} of the torch ops `step()` ran."""
    rec = _Recorder()
    with rec:
        step()
    out: dict[str, Counter] = {}
    for name, n in rec.ops.items():
        out.setdefault(classify(name), Counter())[name] += n
    return out
