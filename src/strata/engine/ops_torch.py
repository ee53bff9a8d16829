"""Plain PyTorch ops on float32 weights dequantised at load: the executor's reference twin.

Every weight becomes float32 in its logical shape (gguf-py's dequantisers, the reference
implementation of every GGML block type, for the block types strata's kernels do not
decode); the maths is transformers' Llama (rotate-half RoPE, GQA, RMSNorm, SwiGLU/GeGLU)
written out over a KV cache. Memory: 4 bytes per weight, whatever the file stores.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from strata.engine import kvcache
from strata.engine.weights import ModelWeights, Stored
from strata.errors import InputError


def dequantize(w: Stored) -> torch.Tensor:
    """float32 values of a stored tensor, in its logical shape."""
    if w.kind in ("F32", "F16"):
        return w.data.float().reshape(w.shape)
    from strata.kernels.ops import _quant

    kind = w.kind.lower()
    if kind in _quant.BLOCK_BYTES:
        return _quant.dequantize(kind, w.data, w.shape[-1], torch.float32).reshape(w.shape)
    import gguf

    try:
        values = gguf.quants.dequantize(w.data.cpu().numpy(), gguf.GGMLQuantizationType[w.kind])
    except (NotImplementedError, KeyError):
        raise InputError(f"gguf-py cannot dequantise {w.kind} (ops torch)") from None
    return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32)) \
        .reshape(w.shape).to(w.data.device)


@dataclass
class TorchOps:
    name: str = "torch"

    @classmethod
    def for_weights(cls, weights: ModelWeights, device: torch.device,
                    say: Callable[[str], None], kv: str = "f32") -> TorchOps:
        return cls()  # any cache dtype: attention widens what it reads to the queries

    def prepare(self, name: str, w: Stored) -> torch.Tensor:
        return dequantize(w)

    def nbytes(self, held: Any) -> int:
        return held.numel() * held.element_size()

    def embed(self, table: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return table[ids]

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x @ w.T

    def expert(self, w: torch.Tensor, e: int) -> torch.Tensor:
        return w[e]

    def rmsnorm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        c, s = cos[:, None, :], sin[:, None, :]  # [T, 1, D/2] over the heads
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: int,
                  pos_t: torch.Tensor | None, scale: float, window: int = 0,
                  sinks: torch.Tensor | None = None) -> torch.Tensor:
        end = pos + q.shape[-2]
        rep = q.shape[-3] // k.shape[-3]  # GQA: consecutive query heads share a KV head
        kind = kvcache.of(k)  # f16 widened, q8_0 blocks dequantised: the cache's values
        keys = kind.widen(k[..., :end, :], q.dtype).repeat_interleave(rep, dim=-3)
        values = kind.widen(v[..., :end, :], q.dtype).repeat_interleave(rep, dim=-3)
        # query i sits at position pos + i and sees keys 0..pos + i (causal at any depth)
        keys_at = torch.arange(end, device=q.device)[None, :]
        query_at = torch.arange(pos, end, device=q.device)[:, None]
        mask = keys_at <= query_at
        if window > 0:  # and the last `window` positions only (llama.cpp's standard SWA)
            mask &= keys_at > query_at - window
        if sinks is None:
            return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale)
        return _sink_attention(q, keys, values, mask, scale, sinks)

    def glu(self, activation: str, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return _GLUS[activation](gate, up)


def _sink_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                    scale: float, sinks: torch.Tensor) -> torch.Tensor:
    """Softmax attention whose denominator also holds exp(sink) of the query's head: the
    sink is one more (unscaled) score with no value, as ggml's soft_max with sinks."""
    scores = (q @ k.transpose(-1, -2)) * scale  # [..., H, T, C]
    scores = scores.masked_fill(~mask, float("-inf"))
    sink = sinks.reshape(-1, 1, 1).expand(*scores.shape[:-1], 1)
    probs = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]
    return probs @ v


def _ggml_gelu(x: torch.Tensor) -> torch.Tensor:
    from strata.kernels.ops.gelu_mul import ggml_gelu

    return ggml_gelu(x)


# GELU as llama.cpp's CPU backend computes it (input and result rounded to fp16: the
# gelu_mul op's docstring): transformers' exact tanh GELU differs from it by up to 2^-11
# relative per activation, which moves logits by ~5e-4 of their scale — the difference
# between the two references, not an error of either
def _swiglu_oai(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """gpt-oss's clamped SwiGLU, as ggml's swiglu_oai (alpha 1.702, limit 7)."""
    x = gate.clamp(max=7.0)
    return x * torch.sigmoid(1.702 * x) * (up.clamp(-7.0, 7.0) + 1.0)


_GLUS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "silu": lambda g, u: F.silu(g) * u, "gelu": lambda g, u: _ggml_gelu(g) * u,
    "swiglu_oai": _swiglu_oai}
