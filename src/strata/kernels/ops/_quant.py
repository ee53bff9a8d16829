"""GGUF q8_0 / q4_0 / q5_0 blocks: random generation and decoding (the oracle side).

Block layouts (32 weights each): q8_0 = fp16 scale + 32 int8 (34 bytes); q4_0 = fp16 scale
+ 16 bytes, byte j holding weight j (low nibble) and weight j+16 (high nibble), value
d*(nibble - 8) (18 bytes); q5_0 = fp16 scale, qh (4 bytes, a little-endian uint32 whose bit
j is weight j's fifth bit), then q4_0's 16 nibble bytes, value d*(nibble + 16*bit - 16)
(22 bytes).
"""

from __future__ import annotations

from typing import Any

QK = 32
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18, "q5_0": 22}


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
    if kind == "q5_0":
        qh = blocks[:, :, 2:6].to(torch.int64)
        bits = qh[..., 0] | (qh[..., 1] << 8) | (qh[..., 2] << 16) | (qh[..., 3] << 24)
        high = (bits[..., None] >> torch.arange(QK, device=w.device)) & 1
        return (q + 16 * high - 16).to(torch.float32), d
    return (q - 8).to(torch.float32), d


def dequantize(kind: str, w: Any, k: int, dtype: Any = None) -> Any:
    """Float tensor [rows, k] of the blocks' values (float64 unless `dtype` says otherwise)."""
    import torch

    dtype = dtype or torch.float64
    q, d = decode(kind, w.cpu(), k)
    return (q.to(dtype) * d.to(dtype)[..., None]).reshape(w.shape[0], k).to(w.device)
