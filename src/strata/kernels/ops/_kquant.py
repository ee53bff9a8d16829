"""GGML's K-quant blocks (the oracle side): layouts, integer decoding, random generation, and
the q8_K activation quantisation llama.cpp's CPU backend dots them with.

Super-blocks of 256 weights (ggml-common.h):

  q4_K  144 B: fp16 d, fp16 dmin, scales[12] (8 six-bit scales + 8 six-bit mins), qs[128]
  q5_K  176 B: as q4_K, then qh[32] before qs[128] (the fifth bit of every weight)
  q6_K  210 B: ql[128], qh[64], int8 scales[16], fp16 d (last)

  q4_K / q5_K: 8 sub-blocks of 32, w = d·sc_j·q - dmin·m_j (q in 0..15 / 0..31);
  q6_K:        16 sub-blocks of 16, w = d·sc_j·(q - 32) (q in 0..63).

Scale/min unpacking (ggml's get_scale_min_k4), j = sub-block 0..7 of `scales` bytes s:
  j < 4: sc = s[j] & 63,                          m = s[j+4] & 63
  j ≥ 4: sc = (s[j+4] & 15) | ((s[j-4] >> 6) << 4), m = (s[j+4] >> 4) | ((s[j] >> 6) << 4)

Weight order within a super-block: q4_K/q5_K chunk c (0..3) of qs[32c..32c+32): low nibbles
are weights 64c..64c+31, high nibbles 64c+32..64c+63; q5_K's fifth bit of those is bit 2c
(low) or 2c+1 (high) of qh[l]. q6_K half h (0, 1) of ql[64h..], qh[32h..]: for l < 32,
weights 128h+l, +32, +64, +96 take ql[l] & 15, ql[l+32] & 15, ql[l] >> 4, ql[l+32] >> 4 and
bits 0-1, 2-3, 4-5, 6-7 of qh[l] as their two high bits; weight v uses scales[v // 16].

q8_K (ggml's quantize_row_q8_K_ref, what the x86 CPU backend quantises activations with):
per 256 values, max = the first value of largest |x|; all zero -> d = 0, q = 0; else
iscale = -127/max (float32 division), q = min(127, round_half_even(iscale·x)) (float32
product), d = 1/iscale (float32 division: not max/127), bsums = sums of 16 consecutive q.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

QK_K = 256
BLOCK_BYTES = {"q4_K": 144, "q5_K": 176, "q6_K": 210}
SUB = {"q4_K": 32, "q5_K": 32, "q6_K": 16}  # weights per sub-block (one scale each)
KINDS = tuple(BLOCK_BYTES)


@dataclass
class Decoded:
    """A K-quant tensor as integers: q [rows, nsb, 256] (q6_K: q - 32), per sub-block scale
    and min [rows, nsb, 256 / SUB] (min None for q6_K), d and dmin [rows, nsb] float32."""

    q: Any
    scale: Any
    d: Any
    minimum: Any = None
    dmin: Any = None


def _half(blocks: Any, at: int) -> Any:
    import torch

    return blocks[:, :, at:at + 2].contiguous().view(torch.float16).to(torch.float32)[..., 0]


def _scale_min_k4(s: Any) -> tuple[Any, Any]:
    """(scales, mins) [.., 8] from the 12 packed bytes [.., 12] (int64)."""
    import torch

    lo_sc, lo_m = s[..., 0:4] & 63, s[..., 4:8] & 63
    hi_sc = (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)
    hi_m = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return torch.cat([lo_sc, hi_sc], dim=-1), torch.cat([lo_m, hi_m], dim=-1)


def _nibbles(qs: Any) -> Any:
    """qs [.., 128] -> 256 values in weight order (chunk c: 32 low nibbles, 32 high)."""
    import torch

    c = qs.reshape(*qs.shape[:-1], 4, 32)
    return torch.stack([c & 15, c >> 4], dim=-2).reshape(*qs.shape[:-1], QK_K)


def _q5_high(qh: Any) -> Any:
    """qh [.., 32] -> the fifth bit (0/16) of the 256 weights in weight order."""
    import torch

    bits = torch.stack([(qh >> b) & 1 for b in range(8)], dim=-2)  # [.., 8, 32]: bit b of l
    return (bits * 16).reshape(*qh.shape[:-1], QK_K)  # sub-block b = weights 32b..32b+31


def _q6(ql: Any, qh: Any) -> Any:
    """ql [.., 128], qh [.., 64] -> q - 32 of the 256 weights in weight order."""
    import torch

    out = []
    for h in range(2):
        lo, hi = ql[..., 64 * h:64 * h + 64], qh[..., 32 * h:32 * h + 32]
        a, b = lo[..., :32], lo[..., 32:]
        out += [(a & 15) | (((hi >> 0) & 3) << 4), (b & 15) | (((hi >> 2) & 3) << 4),
                (a >> 4) | (((hi >> 4) & 3) << 4), (b >> 4) | (((hi >> 6) & 3) << 4)]
    return torch.cat(out, dim=-1) - 32


def decode(kind: str, w: Any, k: int) -> Decoded:
    """The integers of `w` (uint8 [rows, k/256 * block bytes]), on the CPU."""
    import torch

    rows, nsb = w.shape[0], k // QK_K
    b = w.cpu().reshape(rows, nsb, BLOCK_BYTES[kind])
    bi = b.to(torch.int64)
    if kind == "q6_K":
        scale = b[:, :, 192:208].contiguous().view(torch.int8).to(torch.int64)  # int8
        return Decoded(_q6(bi[:, :, :128], bi[:, :, 128:192]), scale, _half(b, 208))
    sc, m = _scale_min_k4(bi[:, :, 4:16])
    qs_at = 16 if kind == "q4_K" else 48
    q = _nibbles(bi[:, :, qs_at:qs_at + 128])
    if kind == "q5_K":
        q = q + _q5_high(bi[:, :, 16:48])
    return Decoded(q, sc, _half(b, 0), m, _half(b, 2))


def dequantize(kind: str, w: Any, k: int, dtype: Any = None) -> Any:
    """Float tensor [rows, k] of the weights (float64 unless `dtype` says otherwise)."""
    import torch

    dtype = dtype or torch.float64
    dec = decode(kind, w, k)
    per = QK_K // dec.scale.shape[-1]
    sc = dec.scale.repeat_interleave(per, dim=-1).to(dtype)
    vals = dec.d.to(dtype)[..., None] * sc * dec.q.to(dtype)
    if dec.minimum is not None:
        vals = vals - dec.dmin.to(dtype)[..., None] * \
            dec.minimum.repeat_interleave(per, dim=-1).to(dtype)
    return vals.reshape(w.shape[0], k).to(w.device)


# -- q8_K activations ------------------------------------------------------------------------

@dataclass
class Q8K:
    q: Any  # float64 [B, nsb, 256], integer-valued in [-127, 127]
    d: Any  # float32 [B, nsb]
    bsums: Any  # float64 [B, nsb, 16]


def quantize_q8_k(x: Any) -> Q8K:
    """ggml's quantize_row_q8_K_ref of the rows of x [B, K] (float32 arithmetic)."""
    import torch

    x = x.to(torch.float32).cpu()
    blocks = x.reshape(x.shape[0], -1, QK_K)
    first = blocks.abs().argmax(dim=-1, keepdim=True)  # the first of the largest |x|
    mx = blocks.gather(-1, first)[..., 0].to(torch.float64)
    zero = mx == 0
    safe = torch.where(zero, torch.ones_like(mx), mx)
    # float32 divisions, correctly rounded: taken in float64, rounded once (53 >= 2·24 + 2)
    iscale = (-127.0 / safe).to(torch.float32)
    q = torch.round(blocks * iscale[..., None]).clamp(max=127.0)  # half to even; f32 product
    d = (1.0 / iscale.to(torch.float64)).to(torch.float32)
    q = torch.where(zero[..., None], torch.zeros_like(q), q).to(torch.float64)
    d = torch.where(zero, torch.zeros_like(d), d)
    return Q8K(q, d, q.reshape(*q.shape[:-1], 16, 16).sum(-1))


def linear(kind: str, x: Any, w: Any, acc: Any = None, chunk_rows: int = 1024) -> Any:
    """out[b, n] with llama.cpp's numerics: per super-block f32(d_x·d) · Σ_j sc_j · Σ q·q_x
    - f32(d_x·dmin) · Σ_j m_j · bsum_j (q4_K/q5_K), integer sums exact; the products and the
    sum over super-blocks in `acc` (float64: the oracle, exact but for the last rounding;
    float32: the vendor path)."""
    import torch

    acc = acc or torch.float64
    B, K = x.shape
    ax = quantize_q8_k(x)
    out = torch.empty(B, w.shape[0], dtype=torch.float32)
    for n0 in range(0, w.shape[0], chunk_rows):
        dec = decode(kind, w[n0:n0 + chunk_rows], K)
        out[:, n0:n0 + chunk_rows] = _dot(dec, ax, acc)
    return out.to(x.device)


def _dot(dec: Decoded, ax: Q8K, acc: Any) -> Any:
    import torch

    per = QK_K // dec.scale.shape[-1]
    n, nsb = dec.q.shape[0], dec.q.shape[1]
    # Σ_v q·q_x per sub-block: [B, N, nsb, nsub] integers (exact in float64)
    qw = dec.q.to(torch.float64).reshape(n, nsb, -1, per)
    qx = ax.q.reshape(ax.q.shape[0], nsb, -1, per)
    isub = torch.einsum("nsjv,bsjv->bnsj", qw, qx)
    sumi = (isub * dec.scale.to(torch.float64)).sum(-1)  # [B, N, nsb]
    d = (ax.d[:, None, :] * dec.d[None, :, :]).to(torch.float32)  # f32(d_x·d): ggml's product
    total = d.to(acc) * sumi.to(acc)
    if dec.minimum is not None:
        msum = ax.bsums.reshape(ax.bsums.shape[0], nsb, 8, 2).sum(-1)  # per 32-sub-block
        summ = torch.einsum("nsj,bsj->bns", dec.minimum.to(torch.float64), msum)
        dmin = (ax.d[:, None, :] * dec.dmin[None, :, :]).to(torch.float32)
        total = total - dmin.to(acc) * summ.to(acc)
    return total.sum(-1).to(torch.float32)


# -- random blocks -------------------------------------------------------------------------

def _f16_bytes(values: Any) -> Any:
    import torch

    return values.to(torch.float16).contiguous().view(torch.uint8).reshape(*values.shape, 2)


def random_blocks(kind: str, rows: int, k: int, seed: int) -> Any:
    """uint8 [rows, k/256 · block bytes]: random quants, scales and mins (every packed bit
    pattern, the high scale bits of every sub-block included), finite fp16 d/dmin of both
    signs with a few subnormals."""
    import torch

    nsb = k // QK_K
    g = torch.Generator().manual_seed(seed * 7919 + 3)
    body = torch.randint(0, 256, (rows, nsb, BLOCK_BYTES[kind]), generator=g,
                         dtype=torch.uint8)
    d = (torch.rand(rows, nsb, generator=g) * 2e-3 + 1e-4) * \
        torch.sign(torch.randn(rows, nsb, generator=g))
    d.view(-1)[:: max(1, d.numel() // 5)] = 3e-6  # an fp16 subnormal
    if kind == "q6_K":
        body[:, :, 208:210] = _f16_bytes(d)
    else:
        dmin = torch.rand(rows, nsb, generator=g) * 1e-3 * \
            torch.sign(torch.randn(rows, nsb, generator=g))
        body[:, :, 0:2], body[:, :, 2:4] = _f16_bytes(d), _f16_bytes(dmin)
    return body.reshape(rows, nsb * BLOCK_BYTES[kind]).contiguous()
