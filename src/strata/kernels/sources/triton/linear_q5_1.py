# strata-kernel: op=linear_q5_1 dialect=triton entry=launch dtypes=float32
"""linear_q5_1 (triton): x [B,K] float32 @ GGUF q5_1 weight [N, K/32*24]^T with ggml's
numerics (docs/kernels-abi.md; ggml_vec_dot_q5_1_q8_1): the q4_1 program below with 24-byte
blocks (d, m, qh: a little-endian uint32 whose bit j is weight j's fifth bit, then the
nibbles), weights nibble + 16*bit (the K-quant mixes' fallback for Q5_K on rows that are not
whole 256-blocks).

linear_q4_0's program with 20-byte blocks (fp16 d, fp16 min m, 16 nibble bytes: weight j the
low nibble of byte j, weight j+16 its high nibble, value d*nibble + m) and x quantised to
q8_1 as ggml's AVX2 quantize_row_q8_1: amax = max |x|, d = amax/127 (IEEE division),
d_x = fp16(d), id = 127/amax (0 when amax = 0), q_x = round_half_even(x*id) (product rounded
to float32 first: no contraction), s_x = fp16(d * sum q_x) with the float32 d. Per block
acc += (d_w*d_x) * isum + m_w*s_x, isum = sum nibble*q_x in int32 (exact).
"""
import triton
import triton.language as tl


@triton.jit
def _linear_q5_1_kernel(out_ptr, x_ptr, w_ptr, N, K, NB, ROW_BYTES,
                        BLOCK_N: tl.constexpr, NBLK: tl.constexpr, FIVE: tl.constexpr):
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
        d = tl.math.div_rn(amax, 127.0)
        dx = d.to(tl.float16).to(tl.float32)
        nonzero = amax != 0.0
        inv = tl.where(nonzero, tl.math.div_rn(127.0, tl.where(nonzero, amax, 1.0)), 0.0)
        q_lo = (((x_lo * inv[:, None]) + 12582912.0) - 12582912.0).to(tl.int32)
        q_hi = (((x_hi * inv[:, None]) + 12582912.0) - 12582912.0).to(tl.int32)
        qsum = tl.sum(q_lo, axis=1) + tl.sum(q_hi, axis=1)
        sx = (d * qsum.to(tl.float32)).to(tl.float16).to(tl.float32)
        m2 = mask_n[:, None] & mask_b[None, :]
        bp = row_base[:, None] + blk[None, :] * (24 if FIVE else 20)
        dw = (tl.load(bp, mask=m2, other=0).to(tl.uint16)
              | (tl.load(bp + 1, mask=m2, other=0).to(tl.uint16) << 8)
              ).to(tl.float16, bitcast=True).to(tl.float32)
        mw = (tl.load(bp + 2, mask=m2, other=0).to(tl.uint16)
              | (tl.load(bp + 3, mask=m2, other=0).to(tl.uint16) << 8)
              ).to(tl.float16, bitcast=True).to(tl.float32)
        byte = tl.load(bp[:, :, None] + (8 if FIVE else 4) + offs_j[None, None, :],
                       mask=m2[:, :, None], other=0).to(tl.int32)
        w_lo = byte & 15
        w_hi = byte >> 4
        if FIVE:  # q5_1: bit j of the little-endian uint32 qh is weight j's fifth bit
            qh = tl.load(bp + 4, mask=m2, other=0).to(tl.int32) | \
                (tl.load(bp + 5, mask=m2, other=0).to(tl.int32) << 8) | \
                (tl.load(bp + 6, mask=m2, other=0).to(tl.int32) << 16) | \
                (tl.load(bp + 7, mask=m2, other=0).to(tl.int32) << 24)
            w_lo += 16 * ((qh[:, :, None] >> offs_j[None, None, :]) & 1)
            w_hi += 16 * ((qh[:, :, None] >> (offs_j[None, None, :] + 16)) & 1)
        isum = tl.sum(w_lo * q_lo[None, :, :] + w_hi * q_hi[None, :, :], axis=2)
        acc += tl.sum((dw * dx[None, :]) * isum.to(tl.float32) + mw * sx[None, :], axis=1)
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
    _linear_q5_1_kernel[grid](out, x, w, N, K, NB, w.shape[1], BLOCK_N=BLOCK_N, NBLK=NBLK,
                              FIVE=True, num_warps=4, enable_fp_fusion=False)
