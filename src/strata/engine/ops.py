"""The ops an executor runs a layer with: one protocol, one backend per way of computing.

    lab    strata's kernel lab: weights as stored, each op dispatched to the fastest verified
           kernel of the device (`strata.engine.ops_lab`)
    torch  plain PyTorch on float32 weights dequantised at load: the reference twin
           (`strata.engine.ops_torch`)

Shapes: activations are rows [T, C] float32 (T tokens); `rope` takes [T, H, D] with cos/sin
[T, D/2] rotating half-split pairs (i, i + D/2); `attention` takes queries [H, T, D] at
positions [pos, pos + T) and a layer's cache k, v [Hkv, C, D] filled up to pos + T, and is
causal at any depth; with `window` > 0 query t sees keys pos + t - window + 1 .. pos + t only
(sliding-window layers); with `sinks` [H] (gpt-oss) each head's sink logit joins the softmax's
denominator. A backend prepares every weight once (`prepare`) and gets back what it
prepared in `linear`, `embed`, `expert`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch

from strata.engine.weights import ModelWeights, Stored


class Ops(Protocol):
    name: str

    def prepare(self, name: str, w: Stored) -> Any: ...

    def nbytes(self, held: Any) -> int: ...

    def embed(self, table: Any, ids: torch.Tensor) -> torch.Tensor: ...

    def linear(self, x: torch.Tensor, w: Any) -> torch.Tensor: ...

    def expert(self, w: Any, e: int) -> Any: ...

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor: ...

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor: ...

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: int,
                  pos_t: torch.Tensor, scale: float, window: int = 0,
                  sinks: torch.Tensor | None = None) -> torch.Tensor: ...

    def glu(self, activation: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor: ...


# backend name -> factory(weights, device, say, kv=...) -> Ops (kv: the K/V cache's element
# type, a strata.lab.plan.KV_CACHE_OPS key, for the ops that pick their attention by it)
OpsFactory = Callable[..., Ops]
_BACKENDS: dict[str, str] = {"lab": "strata.engine.ops_lab:LabOps.for_weights",
                             "torch": "strata.engine.ops_torch:TorchOps.for_weights"}
DEFAULT = "lab"


def names() -> list[str]:
    return list(_BACKENDS)


def make(name: str, weights: ModelWeights, device: torch.device,
         say: Callable[[str], None] = lambda _m: None, kv: str = "f32") -> Ops:
    """The ops backend `name` ready for `weights` on `device` over a `kv` (f32 or f16) K/V
    cache (the lab verifies what it needs first)."""
    import importlib

    from strata.errors import InputError

    target = _BACKENDS.get(name)
    if target is None:
        raise InputError(f"ops {name!r}: choose one of {', '.join(_BACKENDS)}")
    module, attr = target.split(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj(weights, device, say, kv=kv)
