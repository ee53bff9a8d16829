"""GGUF q8_0 / q4_0 / q5_0 / q4_1 / q5_1 blocks: random generation and decoding (the oracle
side).

Block layouts (32 weights each): q8_0 = fp16 scale + 32 int8 (34 bytes); q4_0 = fp16 scale
+ 16 bytes, byte j holding weight j (low nibble) and weight j+16 (high nibble), value
d*(nibble - 8) (18 bytes); q5_0 = fp16 scale, qh (4 bytes, a little-endian uint32 whose bit
j is weight j's fifth bit), then q4_0's 16 nibble bytes, value d*(nibble + 16*bit - 16)
(22 bytes); q4_1 = fp16 scale d, fp16 min m, q4_0's 16 nibble bytes, value d*nibble + m
(20 bytes); q5_1 = d, m, qh, the nibble bytes, value d*(nibble + 16*bit) + m (24 bytes).
"""

from __future__ import annotations

from typing import Any

QK = 32
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q5_0": 22, "q4_1": 20, "q5_1": 24}
MIN_KINDS = ("q4_1", "q5_1")  # blocks that carry a min m (value d*q + m): q8_1 activations
QH_AT = {"q5_0": 2, "q5_1": 4}  # where the fifth bits start


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


def decode(kind: str, w: Any, k: int) -> tuple[Any, Any]:
    """(q [rows, k/32, 32] float32 integer-valued in weight order, d [rows, k/32] float32 =
    the fp16 scales) of the blocks `w` (uint8 [rows, k/32*block bytes])."""
    import torch

    rows, nb = w.shape[0], k // QK
    blocks = w.reshape(rows, nb, BLOCK_BYTES[kind])
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
