# strata-kernel: op=linear_q5_0 dialect=triton entry=launch dtypes=float32
"""linear_q5_0 (triton): x [B,K] float32 @ GGUF q5_0 weight [N, K/32*22]^T with ggml's
numerics (docs/kernels-abi.md; ggml_vec_dot_q5_0_q8_0): linear_q4_0's program with 22-byte
blocks (fp16 d, qh: a little-endian uint32 whose bit j is weight j's fifth bit, then the 16
nibble bytes) and weights nibble + 16*bit - 16 (the fallback of the K-quant mixes for rows
that are not whole 256-blocks).

Kept simple: grid (cdiv(N, BLOCK_N), B); a program owns BLOCK_N weight rows and one row of
x, walking K NBLK blocks at a time, each block as its two halves (weight j is the low nibble
of byte j, weight j+16 its high nibble). The program quantises those x blocks itself:
    amax = max |x|; d_x = fp16(amax / 127) (IEEE division, round-to-nearest-even to fp16);
    id = 127 / amax (0 when amax = 0); q_x = round_half_even(x * id)
where the rounding is (v + 1.5*2^23) - 1.5*2^23, exact for |v| <= 127, and the kernel is
compiled without floating-point contraction so x*id is rounded to float32 before it.
isum = sum (nib + 16*bit - 16)*q_x in int32 (exact); acc += (d_w*d_x) * isum in float32.
"""
import triton
import triton.language as tl


@triton.jit
def _linear_q5_0_kernel(out_ptr, x_ptr, w_ptr, N, K, NB, ROW_BYTES,
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
        # quantise NBLK blocks of x the ggml way, as halves [NBLK, 16]
        x_off = blk[:, None] * 32 + offs_j[None, :]
        x_lo = tl.load(x_row + x_off, mask=mask_b[:, None], other=0.0)
        x_hi = tl.load(x_row + x_off + 16, mask=mask_b[:, None], other=0.0)
        amax = tl.maximum(tl.max(tl.abs(x_lo), axis=1), tl.max(tl.abs(x_hi), axis=1))
        dx = tl.math.div_rn(amax, 127.0).to(tl.float16).to(tl.float32)
        nonzero = amax != 0.0
        inv = tl.where(nonzero, tl.math.div_rn(127.0, tl.where(nonzero, amax, 1.0)), 0.0)
        v_lo = x_lo * inv[:, None]
        v_hi = x_hi * inv[:, None]
        q_lo = ((v_lo + 12582912.0) - 12582912.0).to(tl.int32)
        q_hi = ((v_hi + 12582912.0) - 12582912.0).to(tl.int32)
        # the weight blocks of BLOCK_N rows
        m2 = mask_n[:, None] & mask_b[None, :]
        bp = row_base[:, None] + blk[None, :] * 22
        lo = tl.load(bp, mask=m2, other=0).to(tl.uint16)
        hi = tl.load(bp + 1, mask=m2, other=0).to(tl.uint16)
        dw = (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)
        qh = tl.load(bp + 2, mask=m2, other=0).to(tl.int32) | \
            (tl.load(bp + 3, mask=m2, other=0).to(tl.int32) << 8) | \
            (tl.load(bp + 4, mask=m2, other=0).to(tl.int32) << 16) | \
            (tl.load(bp + 5, mask=m2, other=0).to(tl.int32) << 24)
        byte = tl.load(bp[:, :, None] + 6 + offs_j[None, None, :], mask=m2[:, :, None],
                       other=0).to(tl.int32)
        bit_lo = (qh[:, :, None] >> offs_j[None, None, :]) & 1
        bit_hi = (qh[:, :, None] >> (offs_j[None, None, :] + 16)) & 1
        isum = tl.sum(((byte & 15) + 16 * bit_lo - 16) * q_lo[None, :, :]
                      + ((byte >> 4) + 16 * bit_hi - 16) * q_hi[None, :, :], axis=2)
        acc += tl.sum((dw * dx[None, :]) * isum.to(tl.float32), axis=1)
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
    _linear_q5_0_kernel[grid](out, x, w, N, K, NB, w.shape[1], BLOCK_N=BLOCK_N, NBLK=NBLK,
                              num_warps=4, enable_fp_fusion=False)
