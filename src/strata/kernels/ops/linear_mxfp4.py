"""linear_mxfp4: x @ GGUF MXFP4 weight^T with llama.cpp's numerics (ggml-cpu's
`ggml_vec_dot_mxfp4_q8_0`: x quantised to q8_0 blocks, integer dots per block); gpt-oss
stores its experts this way.

An MXFP4 block (GGML type 39) is 17 bytes for 32 weights: an E8M0 exponent byte e, then q4_0's
16 nibble bytes (byte j: weight j low, weight j+16 high). A 4-bit code c stands for the e2m1
value doubled, kv[c] = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)[c] (bit 3
the sign, 8 is -0; the magnitudes are not linear in c), and the block scale is halved to
match: 2^(e-128) for every e in 0..255 (ggml's GGML_E8M0_TO_FP32_HALF; e = 0, 1 are the float32
subnormals 2^-128, 2^-127, e = 255 is 2^127, not a NaN). Then exactly linear_q4_0's rules
(_linear_q.py): x quantised to q8_0 as ggml's AVX2 quantize_row_q8_0, per block

    isum = sum_j kv[c_j] * q_x[j]                 (integer, exact)
    out  = sum_blocks f32(2^(e-128) * f32(d_x)) * isum

The scale product is a float32 one in ggml; it is exact unless it leaves float32's normal
range. Below it (e = 0, 1 or a tiny d_x) a block adds ~1e-35 at most, far under the
tolerance; above it (e >= 240 with a large d_x) ggml's product is inf, and inf * isum an inf
or a NaN where the float64 reference has a finite value: such blocks are outside the op's
inputs (the generator plants e = 239 at most, and e = 254, 255 only where |x| <= 127).
"""

from __future__ import annotations

from typing import Any

from strata.kernels.ops import _quant
from strata.kernels.ops._linear_q import register_linear
from strata.kernels.spec import Clause, generator

KIND = "mxfp4"
BLOCK = _quant.BLOCK_BYTES[KIND]
SHAPE = {"B": 3, "N": 12, "K": 128}
LARGE = (128, 140)  # the exponents clause's large e: every one >= 128 (a signed byte < 0)

E2M1_CODES = ("Each 4-bit code c stands for kv[c] = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, "
              "-4, -6, -8, -12)[c] (e2m1 doubled: bit 3 the sign, 8 is -0), not q4_0's c - 8.")
EXPONENTS = ("A block's exponent byte e is unsigned and scales it by 2^(e-128) in float32 for "
             "every e: 0 and 1 give the subnormals 2^-128 and 2^-127 (no NaN, no -inf), "
             "e >= 128 scales up, 254 and 255 give 2^126 and 2^127 (not a NaN).")


def _blocks(w: Any) -> Any:
    return w.view(w.shape[0], -1, BLOCK)


def _every_code(inputs: list[Any], shape: dict[str, int], seed: int) -> None:
    """Every block's 32 codes a random order of 0..15 twice: all 16 values in every block
    (6, 8, 12 and their negatives, -0), against x as made. The generator's large-e blocks
    (±0 codes only) keep their codes: outputs stay their usual size."""
    import torch

    blocks = _blocks(inputs[1])
    n, nb = blocks.shape[:2]
    g = generator(seed * 13 + 1)
    codes = torch.argsort(torch.rand(n, nb, 32, generator=g), dim=2) % 16
    body = (codes[:, :, :16] | (codes[:, :, 16:] << 4)).to(torch.uint8)
    usual = (blocks[:, :, :1] < 128).expand(-1, -1, 16)
    blocks[:, :, 1:] = torch.where(usual, body.to(blocks.device), blocks[:, :, 1:])


def _exponents(inputs: list[Any], shape: dict[str, int], seed: int) -> None:
    """Weight rows n % 3 == 0: every e 0 or 1 (float32-subnormal scales); n % 3 == 1: every e
    in LARGE, except block 0: e 254 (even n) or 255 (odd n) with ±0 codes only, x's block 0
    scaled to amax <= 127 so that ggml's f32(2^127 · d_x) stays finite; other rows as made."""
    import torch

    x, w = inputs
    blocks = _blocks(w)
    n, nb = blocks.shape[:2]
    g = generator(seed * 17 + 3)
    rows = torch.arange(n)[:, None]
    tiny = torch.randint(0, 2, (n, nb), generator=g)
    large = torch.randint(LARGE[0], LARGE[1] + 1, (n, nb), generator=g)
    large[:, 0] = torch.where(torch.arange(n) % 2 == 0, 254, 255)
    e = blocks[:, :, 0].to("cpu", torch.int64)
    e = torch.where(rows % 3 == 0, tiny, torch.where(rows % 3 == 1, large, e))
    blocks[:, :, 0] = e.to(device=blocks.device, dtype=torch.uint8)
    huge = (torch.arange(n, device=blocks.device) % 3 == 1)
    blocks[huge, 0, 1:] &= 0x88  # codes 0 and 8: +0 and -0
    amax = x[:, :_quant.QK].abs().amax(dim=1, keepdim=True)
    x[:, :_quant.QK] *= (127.0 / amax.clamp_min(127.0)).to(x.dtype)


CLAUSES = (
    Clause("e2m1_codes", E2M1_CODES, SHAPE, _every_code),
    Clause("exponents", EXPONENTS, SHAPE, _exponents),
)

SPEC = register_linear(KIND, CLAUSES)
