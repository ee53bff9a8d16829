"""K/V cache element types: how a row of D values is held, written and read back.

llama.cpp's -ctk/-ctv names: f32 holds the values; f16 rounds each to nearest even when the
row is written (half the bytes); q8_0 holds GGUF q8_0 blocks along D — per 32 values an fp16
scale and 32 int8, quantised when the row is written exactly as ggml's quantize_row_q8_0
does (what llama.cpp's cache holds under -ctk q8_0 -ctv q8_0): D/32·34 bytes a row, 1.0625
bytes a value, so D must be a multiple of 32. A layer's cache is k, v [Hkv, C, row(D)] of
`dtype`; readers widen what they read to float (`widen`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from strata.errors import InputError

QK8_0, Q8_0_BYTES = 32, 34  # values and bytes per q8_0 block (GGUF's)


@dataclass(frozen=True)
class KvType:
    name: str  # llama.cpp's -ctk/-ctv name
    dtype: torch.dtype  # the storage element
    block: int = 1  # values per block (a row is whole blocks)
    block_elems: int = 1  # storage elements per block

    @property
    def elem_bytes(self) -> float:
        """Bytes per cached value (q8_0: 34/32)."""
        return self.block_elems * self.dtype.itemsize / self.block

    def row(self, d: int) -> int:
        """Storage elements of a row of `d` values."""
        return d // self.block * self.block_elems

    def row_bytes(self, d: int) -> int:
        return self.row(d) * self.dtype.itemsize

    def check(self, head_dim: int) -> None:
        """InputError when a head of `head_dim` values is not whole blocks."""
        if head_dim % self.block:
            raise InputError(f"K/V cache type {self.name}: blocks of {self.block} values, but "
                             f"this model's heads have {head_dim}; use -ctk/-ctv f16 (or "
                             "--kv-type f16)")

    def store(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """Write the float rows src [..., D] into dst [..., row(D)] (a view into the cache)."""
        if self.block == 1:
            dst.copy_(src)
            return
        from strata.kernels.ops._linear_q import q8_0_blocks

        dst.copy_(q8_0_blocks(src))

    def widen(self, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The values of cache rows t [..., row(D)] as `dtype` [..., D]."""
        if self.block == 1:
            return t.to(dtype)
        from strata.kernels.ops._kv_q8_0 import values

        return values(t, dtype)


KV_TYPES = {t.name: t for t in (KvType("f32", torch.float32), KvType("f16", torch.float16),
                                KvType("q8_0", torch.uint8, QK8_0, Q8_0_BYTES))}
KV_DTYPES = {n: t.dtype for n, t in KV_TYPES.items()}
KV_NAMES = {t.dtype: n for n, t in KV_TYPES.items()}


def kv_type(name: str) -> KvType:
    """The K/V cache type `name` (f32, f16, q8_0); InputError for any other."""
    if name not in KV_TYPES:
        raise InputError(f"K/V cache type {name}: strata's engine keeps it in "
                         f"{', '.join(KV_TYPES)} (llama.cpp also takes bf16, q4_0: -B "
                         "llamacpp)")
    return KV_TYPES[name]


def of(t: torch.Tensor) -> KvType:
    """The type of a cache tensor, by its dtype (float tensors outside a cache: f32/f16)."""
    return KV_TYPES[KV_NAMES.get(t.dtype, "f32")]


def kv_dtype(name: str) -> torch.dtype:
    """The storage dtype of a `name` K/V cache; InputError for an unknown name."""
    return kv_type(name).dtype
