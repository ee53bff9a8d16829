"""Clauses several ops share (spec.Clause): ragged sizes, causal masks, the GQA head mapping,
scores beyond float32's exp range, saturating gates, special block scales of GGUF weights.

Every clause's `text` is written word for word in docs/kernels-abi.md ("Clauses"); its
`apply(inputs, shape, seed)` mutates the inputs `make_inputs` made, in place, whatever their
float dtype or device, so the case exercises the promise.
"""

from __future__ import annotations

import math
from typing import Any

from strata.kernels.ops import _quant
from strata.kernels.spec import Clause, Shape, as_made, generator

# -- sizes ---------------------------------------------------------------------------------------

def ragged(shape: Shape, what: str) -> Clause:
    """The shape alone exercises it: sizes off every vector and block width."""
    return Clause("ragged", f"{what} may be any size, none a multiple of a vector or block "
                  "width: the tails are computed like the rest.", shape, as_made)


# -- attention -------------------------------------------------------------------------------------

CAUSAL = "Query t attends keys 0..t only (causal): later keys get no weight."
GQA = ("Query head h reads kv head h // (H/Hkv): consecutive query heads share a kv head "
       "(not h % Hkv).")
GQA_BACKWARD = ("dk and dv of kv head g sum the gradients of its query heads "
                "g·(H/Hkv) .. (g+1)·(H/Hkv)-1 (head h reads kv head h // (H/Hkv), not "
                "h % Hkv).")
LARGE_SCORES = ("Scores far beyond float32's exp range (|scale·q·k| up to 120) are "
                "softmaxed relative to their row's max: no overflow, no NaN.")
SCORE_TARGET = 120.0  # exp(120) overflows float32 (max ~88.7): an unshifted exp is inf


def causal(shape: Shape) -> Clause:
    return Clause("causal", CAUSAL, shape, as_made)


def gqa(shape: Shape, text: str = GQA) -> Clause:
    return Clause("gqa", text, shape, as_made)


def large_scores(shape: Shape, causal_mask: bool) -> Clause:
    """q (inputs[0]: [H,T,D] or decode's [H,D]) scaled so the largest |score| a query
    attends is SCORE_TARGET; k is inputs[1] ([Hkv,S,D])."""

    def apply(inputs: list[Any], shape: Shape, seed: int) -> None:
        import torch

        q, k = inputs[0], inputs[1]
        qf = q.detach().to("cpu", torch.float64)
        qf = qf[:, None] if qf.dim() == 2 else qf
        kf = k.detach().to("cpu", torch.float64)
        kf = kf.repeat_interleave(qf.shape[0] // kf.shape[0], dim=0)
        scores = (qf @ kf.transpose(-1, -2)) / math.sqrt(qf.shape[-1])
        if causal_mask:
            t, s = scores.shape[-2:]
            scores = scores.masked_fill(torch.ones(t, s, dtype=torch.bool).triu(1), 0.0)
        q.mul_(SCORE_TARGET / float(scores.abs().max()))

    return Clause("large_scores", LARGE_SCORES, shape, apply)


# -- gates ---------------------------------------------------------------------------------------

SATURATION_VALUES = (100.0, -100.0, 1e4, -1e4, 89.0, -89.0, 500.0, -500.0)


def saturate(inputs: list[Any], shape: Shape, seed: int) -> None:
    """Every third element of the gate input a (inputs[0]) set to ±89 .. ±1e4, where
    e^|a| overflows float32."""
    import torch

    a = inputs[0].view(-1)
    n = a[::3].numel()
    vals = torch.tensor(SATURATION_VALUES).repeat(n // len(SATURATION_VALUES) + 1)[:n]
    a[::3] = vals.roll(seed).to(dtype=a.dtype, device=a.device)


# -- GGUF block scales ---------------------------------------------------------------------------

SPECIAL_SCALES = ("Block scales d that are ±0 or fp16 subnormals decode exactly as d·q (no "
                  "flush to zero): rows of only such blocks give 0 or a tiny, exact result.")


def special_scales(kind: str, w_index: int, shape: Shape, name: str = "special_scales") \
        -> Clause:
    """Weight rows n % 3 == 0: every block scale an fp16 subnormal (both signs); n % 3 == 1:
    every scale ±0; the other rows as made. `w_index`: the weight's place in the inputs."""

    def apply(inputs: list[Any], shape: Shape, seed: int) -> None:
        import torch

        w = inputs[w_index]
        n, nb = w.shape[0], w.shape[1] // _quant.BLOCK_BYTES[kind]
        g = generator(seed * 31 + 5)
        mantissa = torch.randint(1, 1024, (n, nb), generator=g).to(torch.float64)
        sign = torch.where(torch.rand(n, nb, generator=g) < 0.5, -1.0, 1.0)
        d = (mantissa * 2.0 ** -24 * sign).to(torch.float16)  # exact fp16 subnormals
        zero = torch.zeros(n, nb, dtype=torch.float16)
        zero[:, 1::2] = -0.0
        rows = torch.arange(n)[:, None]
        d = torch.where(rows % 3 == 0, d, torch.where(rows % 3 == 1, zero, d))
        scales = d.contiguous().view(torch.uint8).view(n, nb, 2).to(w.device)
        blocks = w.view(n, nb, _quant.BLOCK_BYTES[kind])
        keep = (torch.arange(n, device=w.device) % 3 == 2)[:, None, None]
        blocks[:, :, :2] = torch.where(keep, blocks[:, :, :2], scales)

    return Clause(name, SPECIAL_SCALES, shape, apply)
