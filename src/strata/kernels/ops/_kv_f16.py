"""The float16-cache twin of a cached attention op (attention_cached, attention_window,
attention_sinks → *_f16): the same call with k and v [Hkv,C,D] held in float16, what a KV cache
of half the bytes stores (llama.cpp's default -ctk/-ctv f16). Queries, sinks and the output keep
the call's float dtype; a kernel converts each K/V element exactly (binary16 → binary32 is
exact) and computes as the float32-cache op does.

Everything but the inputs' dtype is the base op's: shapes, clauses (the poisoned rows hold
NaN, ±inf and ±1e4 as float16 holds them; ±1e30 becomes ±inf), the dims, and the tolerance.
The oracle is the base op's float64 reference over the float16 values widened, so a kernel is
held to the cache's values, not to the float32 values they were rounded from: the rounding is
the cache's choice (it happens when a K/V row is written), not the kernel's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from strata.kernels.spec import KernelSpec

KV = ("k", "v")


def _widened(spec: KernelSpec, args: tuple[Any, ...]) -> list[Any]:
    """The call's arguments with k and v in the queries' dtype."""
    idx = [spec.inputs.index(n) for n in KV]
    like = args[0]
    return [a.to(like.dtype) if i in idx else a for i, a in enumerate(args)]


def cache_bytes(base: KernelSpec, s: dict[str, int], e: int, per_value: float) -> float:
    """The base op's bytes with its K/V rows at `per_value` bytes a value: the base formula
    is linear in e, q and out take 2·H·T·D of its per-e share, the K/V rows the rest (sinks,
    H elements of a few heads, are counted with them: at worst a few bytes low, never
    high)."""
    per_e = base.bytes(s, 1) - base.bytes(s, 0)
    qo = 2 * s["H"] * s["T"] * s["D"]
    return float(base.bytes(s, 0) + e * qo + per_value * (per_e - qo))


def f16_cache(base: KernelSpec) -> KernelSpec:
    """`base` over a float16 K/V cache, named base.name + "_f16" (torch imported only when
    inputs are made: the specs register without it)."""
    kv = [base.inputs.index(n) for n in KV]

    def make_inputs(s: dict[str, int], dtype: str, seed: int, device: str) -> list[Any]:
        import torch

        inputs = list(base.make_inputs(s, dtype, seed, device))
        for i in kv:
            inputs[i] = inputs[i].to(torch.float16)
        return inputs

    def reference(*args: Any, **params: Any) -> Any:
        return base.reference(*_widened(base, args), **params)

    def eager(*args: Any, **params: Any) -> Any:
        return base.eager(*_widened(base, args), **params)

    return dataclasses.replace(
        base, name=f"{base.name}_f16", summary=f"{base.summary}; float16 K/V cache",
        make_inputs=make_inputs, reference=reference, eager=eager,
        bytes=lambda s, e: cache_bytes(base, s, e, 2),
        fixed_dtypes={**base.fixed_dtypes, "k": "float16", "v": "float16"})
