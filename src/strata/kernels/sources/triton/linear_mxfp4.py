# strata-kernel: op=linear_mxfp4 dialect=triton entry=launch dtypes=float32
"""linear_mxfp4 (triton): x [B,K] float32 @ GGUF MXFP4 weight [N, K/32*17]^T with ggml's
numerics (docs/kernels-abi.md; ggml_vec_dot_mxfp4_q8_0): every 32-block of x is quantised to
q8_0 as ggml's AVX2 path does, integer block dots against the e2m1 codes' doubled values,
scaled by 2^(e-128) * d_x and summed in float32.

linear_q4_0's program with 17-byte blocks: byte 0 the E8M0 exponent e, then 16 bytes whose
low nibble is the code of weight j and high nibble that of weight j+16. A code c stands for
kv[c] = (c & 8 ? -1 : 1) * {0, 1, 2, 3, 4, 6, 8, 12}[c & 7] and the block scale is 2^(e-128)
as float32 from its bits: (e-1) << 23 for e >= 2, the subnormals 2^-128 and 2^-127 (bits 21
and 22) for e = 0, 1. x is quantised per block as linear_q4_0's program does (amax, fp16
d_x by IEEE division, round half to even through 1.5*2^23, no floating-point contraction).
isum = sum kv*q_x in int32 (exact); acc += (scale*d_x) * isum in float32.
"""
import triton
import triton.language as tl


@triton.jit
def _e2m1x2(c):
    """The doubled e2m1 value of 4-bit codes c (int32)."""
    m = c & 7
    mag = tl.where(m < 5, m, tl.where(m == 5, 6, tl.where(m == 6, 8, 12)))
    return tl.where(c >= 8, -mag, mag)


@triton.jit
def _linear_mxfp4_kernel(out_ptr, x_ptr, w_ptr, N, K, NB, ROW_BYTES,
                         BLOCK_N: tl.constexpr, NBLK: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    b = tl.program_id(1).to(tl.int64)
    mask_n = offs_n < N
    row_base = w_ptr + offs_n.to(tl.int64) * ROW_BYTES
    x_row = x_ptr + b * K
    offs_blk = tl.arange(0, NBLK)
    offs_j = tl.arange(0, 16)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, NB, NBLK):
        blk = start + offs_blk
        mask_b = blk < NB
        x_off = blk[:, None] * 32 + offs_j[None, :]
        x_lo = tl.load(x_row + x_off, mask=mask_b[:, None], other=0.0)
        x_hi = tl.load(x_row + x_off + 16, mask=mask_b[:, None], other=0.0)
        amax = tl.maximum(tl.max(tl.abs(x_lo), axis=1), tl.max(tl.abs(x_hi), axis=1))
        dx = tl.math.div_rn(amax, 127.0).to(tl.float16).to(tl.float32)
        nonzero = amax != 0.0
        inv = tl.where(nonzero, tl.math.div_rn(127.0, tl.where(nonzero, amax, 1.0)), 0.0)
        q_lo = ((x_lo * inv[:, None] + 12582912.0) - 12582912.0).to(tl.int32)
        q_hi = ((x_hi * inv[:, None] + 12582912.0) - 12582912.0).to(tl.int32)
        m2 = mask_n[:, None] & mask_b[None, :]
        bp = row_base[:, None] + blk[None, :] * 17
        e = tl.load(bp, mask=m2, other=2).to(tl.int32)
        bits = tl.where(e < 2, 0x00200000 << e, (e - 1) << 23)
        scale = bits.to(tl.float32, bitcast=True)
        byte = tl.load(bp[:, :, None] + 1 + offs_j[None, None, :], mask=m2[:, :, None],
                       other=0).to(tl.int32)
        isum = tl.sum(_e2m1x2(byte & 15) * q_lo[None, :, :] +
                      _e2m1x2(byte >> 4) * q_hi[None, :, :], axis=2)
        acc += tl.sum((scale * dx[None, :]) * isum.to(tl.float32), axis=1)
    tl.store(out_ptr + b * N + offs_n, acc, mask=mask_n)


def launch(out, x, w):
    B, K = x.shape
    N = w.shape[0]
    if B == 0 or N == 0:
        return
    NB = K // 32
    BLOCK_N = 16
    NBLK = max(1, min(8, triton.next_power_of_2(NB)))
    grid = (triton.cdiv(N, BLOCK_N), B)
    _linear_mxfp4_kernel[grid](out, x, w, N, K, NB, w.shape[1], BLOCK_N=BLOCK_N, NBLK=NBLK,
                               num_warps=4, enable_fp_fusion=False)
