# strata-kernel: op=linear_q8_0 dialect=triton entry=launch dtypes=float32
"""linear_q8_0 (triton): x [B,K] float32 @ GGUF q8_0 weight [N, K/32*34]^T with ggml's
numerics (docs/kernels-abi.md): every 32-block of x is quantised to q8_0 as ggml's AVX2
path does, then integer block dots are scaled by d_w*d_x and summed in float32.

Kept simple: grid (cdiv(N, BLOCK_N), B); a program owns BLOCK_N weight rows and one row of
x, walking K NBLK blocks at a time. It quantises those x blocks itself (recomputed by every
program of the row: cheap next to the weights):
    amax = max |x|; d_x = fp16(amax / 127) (IEEE division, round-to-nearest-even to fp16);
    id = 127 / amax (0 when amax = 0); q_x = round_half_even(x * id)
where the rounding is (v + 1.5*2^23) - 1.5*2^23, exact for |v| <= 127, and the kernel is
compiled without floating-point contraction so x*id is rounded to float32 before it (an
fma would round the exact product instead). The weight block is 2 bytes of fp16 scale
(little-endian, rebuilt from two byte loads) then 32 int8. isum = sum q_w*q_x in int32
(exact); acc += (d_w*d_x) * isum in float32.
"""
import triton
import triton.language as tl


@triton.jit
def _linear_q8_0_kernel(out_ptr, x_ptr, w_ptr, N, K, NB, ROW_BYTES,
                        BLOCK_N: tl.constexpr, NBLK: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    b = tl.program_id(1).to(tl.int64)
    mask_n = offs_n < N
    row_base = w_ptr + offs_n.to(tl.int64) * ROW_BYTES
    x_row = x_ptr + b * K
    offs_blk = tl.arange(0, NBLK)
    offs_j = tl.arange(0, 32)
    acc = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, NB, NBLK):
        blk = start + offs_blk
        mask_b = blk < NB
        # quantise NBLK blocks of x the ggml way
        xv = tl.load(x_row + blk[:, None] * 32 + offs_j[None, :], mask=mask_b[:, None],
                     other=0.0)
        amax = tl.max(tl.abs(xv), axis=1)
        dx = tl.math.div_rn(amax, 127.0).to(tl.float16).to(tl.float32)
        nonzero = amax != 0.0
        inv = tl.where(nonzero, tl.math.div_rn(127.0, tl.where(nonzero, amax, 1.0)), 0.0)
        v = xv * inv[:, None]
        qx = ((v + 12582912.0) - 12582912.0).to(tl.int32)
        # the weight blocks of BLOCK_N rows
        m2 = mask_n[:, None] & mask_b[None, :]
        bp = row_base[:, None] + blk[None, :] * 34
        lo = tl.load(bp, mask=m2, other=0).to(tl.uint16)
        hi = tl.load(bp + 1, mask=m2, other=0).to(tl.uint16)
        dw = (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)
        qw = tl.load(bp[:, :, None] + 2 + offs_j[None, None, :], mask=m2[:, :, None], other=0)
        qw = qw.to(tl.int8, bitcast=True).to(tl.int32)
        isum = tl.sum(qw * qx[None, :, :], axis=2)
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
    _linear_q8_0_kernel[grid](out, x, w, N, K, NB, w.shape[1], BLOCK_N=BLOCK_N, NBLK=NBLK,
                              num_warps=4, enable_fp_fusion=False)
