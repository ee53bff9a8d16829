"""strata's own engine: one forward pass for every architecture, layer range and ops backend.

    from strata.engine import load
    ex = load("model.gguf", first=0, last=None, ops="lab", device="cpu")
    ex.reset(256)
    logits = ex.forward(torch.tensor(ids), pos=0)

`weights.py` reads a layer range as stored; `ops.py` names the backends (`ops_lab.py`: the
kernel lab, weights as stored; `ops_torch.py`: float32, the reference twin); `executor.py`
runs the architecture declared in `strata.models.arch`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from strata.engine.executor import Executor


def load(path: str | Path, first: int | None = None, last: int | None = None,
         ops: str = "lab", device: str = "cpu",
         say: Callable[[str], None] = lambda _m: None, kv: str = "f32") -> Executor:
    """An executor over layers [first, last) of the GGUF at `path` with the `ops` backend,
    its K/V cache in `kv` (f32, f16 or q8_0)."""
    from strata.backends.torch_device import resolve_device
    from strata.engine import ops as ops_registry
    from strata.engine.executor import Executor
    from strata.engine.kvcache import kv_type
    from strata.engine.weights import read_range

    dev = resolve_device(device)
    cache = kv_type(kv)
    weights = read_range(Path(path), first, last, dev)
    cache.check(weights.spec.head_dim)  # before the ops are made (lab: verified, built)
    return Executor.build(weights, ops_registry.make(ops, weights, dev, say, kv), dev,
                          kv_dtype=cache.dtype)


__all__ = ["load"]
