"""GGUF q8_0 / q4_0 / q5_0 / q4_1 / q5_1 / MXFP4 blocks: random generation and decoding (the
oracle side).

Block layouts (32 weights each): q8_0 = fp16 scale + 32 int8 (34 bytes); q4_0 = fp16 scale
+ 16 bytes, byte j holding weight j (low nibble) and weight j+16 (high nibble), value
d*(nibble - 8) (18 bytes); q5_0 = fp16 scale, qh (4 bytes, a little-endian uint32 whose bit
j is weight j's fifth bit), then q4_0's 16 nibble bytes, value d*(nibble + 16*bit - 16)
(22 bytes); q4_1 = fp16 scale d, fp16 min m, q4_0's 16 nibble bytes, value d*nibble + m
(20 bytes); q5_1 = d, m, qh, the nibble bytes, value d*(nibble + 16*bit) + m (24 bytes);
mxfp4 (GGML type 39, gpt-oss's experts) = an E8M0 exponent byte e, then q4_0's 16 nibble bytes,
value 2^(e-128) * MXFP4_VALUES[nibble] (17 bytes): the e2m1 values doubled with the scale
halved, as ggml's kvalues_mxfp4 and GGML_E8M0_TO_FP32_HALF (e = 0, 1: float32 subnormals).
decode() gives every kind as integer-valued q times a float32 d (mxfp4: d = 2^(e-128)).
"""

from __future__ import annotations

from typing import Any

QK = 32
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q5_0": 22, "q4_1": 20, "q5_1": 24, "mxfp4": 17}
MIN_KINDS = ("q4_1", "q5_1")  # blocks that carry a min m (value d*q + m): q8_1 activations
QH_AT = {"q5_0": 2, "q5_1": 4}  # where the fifth bits start
# mxfp4's 16 codes: e2m1 (sign bit 3; 8 is -0) doubled, so that they are integers
MXFP4_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
MXFP4_EXPONENTS = (116, 126)  # random e: scales 2^-12 .. 2^-2, weights up to 3 (gpt-oss-like)
# planted in every 7th block: the float32 subnormal scales, and a large e whose float32 scale
# times any finite fp16 d_x stays finite (2^111 * 65504 < 2^127; at e = 254 ggml's own
# f32(2^126 * d_x) is inf for d_x >= 4, inf * 0 a NaN). The large-e blocks hold only ±0
# codes (contributing 0, so outputs keep their size): a kernel that decodes e through an
# fp16 or a float32 that overflows gets NaN there; the op's `exponents` clause checks values.
MXFP4_PLANTED = (0, 1, 239)


def _scales(n: int, seed: int) -> Any:
    """fp16 scales of both signs, with a few subnormals so kernels must decode them."""
    import torch

    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, generator=g) * 0.02 + 0.001) * torch.sign(torch.randn(n, generator=g))
    d[:: max(1, n // 7)] = 3e-6  # subnormal in fp16 (below 6.1e-5)
    return d.to(torch.float16)


def random_blocks(kind: str, rows: int, k: int, seed: int) -> Any:
    """uint8 [rows, k/32*block bytes] of random blocks."""
    import torch

    if kind == "mxfp4":
        return _mxfp4_blocks(rows, k, seed)
    nb = k // QK
    g = torch.Generator().manual_seed(seed + 1)
    scale_bytes = _scales(rows * nb, seed).view(torch.uint8).view(rows, nb, 2)
    if kind == "q8_0":
        q = torch.randint(-128, 128, (rows, nb, QK), generator=g, dtype=torch.int8)
        body = q.view(torch.uint8)
    else:
        body = torch.randint(0, 256, (rows, nb, BLOCK_BYTES[kind] - 2), generator=g,
                             dtype=torch.uint8)
    if kind in MIN_KINDS:  # finite fp16 mins of both signs (random bytes could be NaN/inf)
        body[:, :, 0:2] = _scales(rows * nb, seed + 7).view(torch.uint8).view(rows, nb, 2)
    return torch.cat([scale_bytes, body], dim=2).reshape(rows, nb * BLOCK_BYTES[kind]) \
        .contiguous()


def _mxfp4_blocks(rows: int, k: int, seed: int) -> Any:
    """uint8 [rows, k/32*17] of random mxfp4 blocks: e in MXFP4_EXPONENTS, random codes, and
    every 7th block's e one of MXFP4_PLANTED (the large one with ±0 codes only)."""
    import torch

    nb = k // QK
    g = torch.Generator().manual_seed(seed + 1)
    lo, hi = MXFP4_EXPONENTS
    e = torch.randint(lo, hi + 1, (rows * nb,), generator=g, dtype=torch.int64)
    body = torch.randint(0, 256, (rows * nb, 16), generator=g, dtype=torch.uint8)
    at = torch.arange(1, rows * nb, max(1, rows * nb // 7))  # a lone block stays usual
    planted = torch.tensor(MXFP4_PLANTED)[torch.arange(len(at)) % len(MXFP4_PLANTED)]
    e[at] = planted
    big = at[planted == max(MXFP4_PLANTED)]
    body[big] &= 0x88  # codes 0 and 8: +0 and -0
    blocks = torch.cat([e.to(torch.uint8)[:, None], body], dim=1)
    return blocks.reshape(rows, nb * BLOCK_BYTES["mxfp4"]).contiguous()


def _mxfp4_decode(blocks: Any) -> tuple[Any, Any]:
    """(q, d) of mxfp4 blocks [rows, nb, 17]: q = MXFP4_VALUES[code] in weight order, d =
    2^(e-128) (float64 power of two rounded once to float32: exact, subnormals included)."""
    import torch

    body = blocks[:, :, 1:].to(torch.int64)
    codes = torch.cat([body & 0xF, body >> 4], dim=2)
    table = torch.tensor(MXFP4_VALUES, dtype=torch.float32, device=blocks.device)
    e = blocks[:, :, 0].to(torch.float64)
    d = torch.exp2(e - 128.0).to(torch.float32)
    return table[codes], d


def decode(kind: str, w: Any, k: int) -> tuple[Any, Any]:
    """(q [rows, k/32, 32] float32 integer-valued in weight order, d [rows, k/32] float32 =
    the fp16 scales; mxfp4: 2^(e-128)) of the blocks `w` (uint8 [rows, k/32*block bytes])."""
    import torch

    rows, nb = w.shape[0], k // QK
    blocks = w.reshape(rows, nb, BLOCK_BYTES[kind])
    if kind == "mxfp4":
        return _mxfp4_decode(blocks)
    d = blocks[:, :, :2].contiguous().view(torch.float16).to(torch.float32).reshape(rows, nb)
    if kind == "q8_0":
        return blocks[:, :, 2:].contiguous().view(torch.int8).to(torch.float32), d
    body = blocks[:, :, -16:].to(torch.int16)
    q = torch.cat([body & 0xF, body >> 4], dim=2)
    if kind in QH_AT:
        at = QH_AT[kind]
        qh = blocks[:, :, at:at + 4].to(torch.int64)
        bits = qh[..., 0] | (qh[..., 1] << 8) | (qh[..., 2] << 16) | (qh[..., 3] << 24)
        q = q + 16 * ((bits[..., None] >> torch.arange(QK, device=w.device)) & 1)
    if kind in MIN_KINDS:
        return q.to(torch.float32), d  # unsigned: the min is added apart (minimum())
    return (q - (16 if kind == "q5_0" else 8)).to(torch.float32), d


def minimum(kind: str, w: Any, k: int) -> Any:
    """The fp16 mins m [rows, k/32] float32 of a q4_1/q5_1 tensor; None for other kinds."""
    import torch

    if kind not in MIN_KINDS:
        return None
    blocks = w.reshape(w.shape[0], k // QK, BLOCK_BYTES[kind])
    return blocks[:, :, 2:4].contiguous().view(torch.float16).to(torch.float32) \
        .reshape(w.shape[0], k // QK)


def dequantize(kind: str, w: Any, k: int, dtype: Any = None) -> Any:
    """Float tensor [rows, k] of the blocks' values (float64 unless `dtype` says otherwise)."""
    import torch

    dtype = dtype or torch.float64
    q, d = decode(kind, w.cpu(), k)
    values = q.to(dtype) * d.to(dtype)[..., None]
    m = minimum(kind, w.cpu(), k)
    if m is not None:
        values = values + m.to(dtype)[..., None]
    return values.reshape(w.shape[0], k).to(w.device)
