"""The q8_0-cache twin of a cached attention op (attention_cached, attention_window,
attention_sinks → *_q8_0): the same call with k and v held as GGUF q8_0 blocks along D —
uint8 [Hkv, C, D/32·34], per 32 values an fp16 scale d and 32 int8 q, value d·q — what a
K/V cache of 1.0625 bytes a value stores (llama.cpp's -ctk q8_0 -ctv q8_0). D is a multiple
of 32. Queries, sinks and the output keep the call's float dtype; a kernel decodes each
value exactly (d·q has at most 19 significant bits: exact in float32) and computes as the
float32-cache op does.

Everything else is the base op's, with each shape's D rounded up to whole blocks: the
clauses (applied to the values, then quantised again: the poisoned rows' NaN or ±inf become
NaN or infinite scales, their ±1e4 large ones), the dims, the tolerance. The oracle is the
base op's float64 reference over the blocks' values, so a kernel is held to the cache's
values, not to the float32 values they were quantised from: the quantisation is the cache's
(when a K/V row is written, strata.engine.kvcache), not the kernel's.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from strata.kernels.ops import _quant
from strata.kernels.ops._kv_f16 import KV, cache_bytes
from strata.kernels.ops._shapes import unique
from strata.kernels.spec import Clause, KernelSpec

QK, BLOCK = _quant.QK, _quant.BLOCK_BYTES["q8_0"]


def _whole_blocks(s: dict[str, int]) -> dict[str, int]:
    return {**s, "D": max(QK, -(-s["D"] // QK) * QK)}


def values(t: Any, dtype: Any) -> Any:
    """The values of q8_0 rows t [..., D/32·34] as `dtype` [..., D] (on t's device; d·q is
    exact in float32, so any float dtype at least as wide holds it exactly)."""
    lead, d = t.shape[:-1], t.shape[-1] // BLOCK * QK
    q, scale = _quant.decode("q8_0", t.reshape(-1, t.shape[-1]), d)
    return (q * scale[..., None]).to(dtype).reshape(*lead, d)


def _quantised(t: Any) -> Any:
    from strata.kernels.ops._linear_q import q8_0_blocks

    return q8_0_blocks(t)


def q8_0_cache(base: KernelSpec) -> KernelSpec:
    """`base` over a q8_0 K/V cache, named base.name + "_q8_0" (torch imported only when
    inputs are made: the specs register without it)."""
    kv = [base.inputs.index(n) for n in KV]

    def widened(args: tuple[Any, ...]) -> list[Any]:
        like = args[0]
        return [values(a, like.dtype) if i in kv else a for i, a in enumerate(args)]

    def make_inputs(s: dict[str, int], dtype: str, seed: int, device: str) -> list[Any]:
        inputs = list(base.make_inputs(s, dtype, seed, device))
        for i in kv:
            inputs[i] = _quantised(inputs[i])
        return inputs

    def clause(c: Clause) -> Clause:
        def apply(inputs: list[Any], shape: dict[str, int], seed: int) -> None:
            import torch

            floats = [values(t, torch.float32) if i in kv else t for i, t in enumerate(inputs)]
            c.apply(floats, shape, seed)
            for i in kv:
                inputs[i].copy_(_quantised(floats[i]))

        return dataclasses.replace(c, shape=_whole_blocks(c.shape), apply=apply)

    return dataclasses.replace(
        base, name=f"{base.name}_q8_0", summary=f"{base.summary}; q8_0 K/V cache",
        make_inputs=make_inputs,
        reference=lambda *args, **params: base.reference(*widened(args), **params),
        eager=lambda *args, **params: base.eager(*widened(args), **params),
        bytes=lambda s, e: cache_bytes(base, s, e, BLOCK / QK),
        clauses=tuple(clause(c) for c in base.clauses),
        shapes={name: unique([_whole_blocks(s) for s in shapes])
                for name, shapes in base.shapes.items()},
        fixed_dtypes={**base.fixed_dtypes, "k": "uint8", "v": "uint8"})
