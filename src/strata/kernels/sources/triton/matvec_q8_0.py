# strata-kernel: op=matvec_q8_0 dialect=triton entry=launch dtypes=float32,bfloat16,float16
"""matvec_q8_0 (triton): out[b,n] = sum_k deq(w)[n,k] * x[b,k] with GGUF q8_0 weights.

w is the raw uint8 tensor [N, K/32*34]: per 32 weights a 34-byte block = little-endian
fp16 scale d (bytes 0-1) then 32 int8 q; value = d*q. The scale is rebuilt from two byte
loads, (lo | hi << 8) bitcast to fp16 (no alignment beyond 1 byte is assumed).

Decode path (B < 16): grid (cdiv(N, BLOCK_N), B); each program computes BLOCK_N outputs
of one input row, walking K in chunks of NBLK quant blocks as a [BLOCK_N, NBLK, 32] tile:
int8 * x summed within each block, then scaled by d and accumulated in float32.
Batched path (B >= 16): grid (cdiv(B, BLOCK_B), cdiv(N, BLOCK_N)); per quant block the
int8 tile [32, BLOCK_N] is converted to x's dtype (exact), multiplied with the x tile
[BLOCK_B, 32] by ``tl.dot`` and scaled per column by d into a float32 accumulator
(64x64 tiles for 16-bit x; 32x32 for float32, whose exact dot needs more registers).
"""
import triton
import triton.language as tl


@triton.jit
def _q8_0_gemv_kernel(out_ptr, w_ptr, x_ptr, N, K, NB, ROW_BYTES,
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
        m2 = mask_n[:, None] & mask_b[None, :]
        bp = row_base[:, None] + blk[None, :] * 34
        lo = tl.load(bp, mask=m2, other=0).to(tl.uint16)
        hi = tl.load(bp + 1, mask=m2, other=0).to(tl.uint16)
        d = (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)
        q = tl.load(bp[:, :, None] + 2 + offs_j[None, None, :], mask=m2[:, :, None], other=0)
        q = q.to(tl.int8, bitcast=True).to(tl.float32)
        xv = tl.load(x_row + blk[:, None] * 32 + offs_j[None, :], mask=mask_b[:, None],
                     other=0.0).to(tl.float32)
        part = tl.sum(q * xv[None, :, :], axis=2)
        acc += tl.sum(part * d, axis=1)
    tl.store(out_ptr + b * N + offs_n, acc.to(out_ptr.dtype.element_ty), mask=mask_n)


@triton.jit
def _q8_0_mm_kernel(out_ptr, w_ptr, x_ptr, B, N, K, NB, ROW_BYTES,
                    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    offs_b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_b = offs_b < B
    mask_n = offs_n < N
    offs_j = tl.arange(0, 32)
    row_base = w_ptr + offs_n.to(tl.int64) * ROW_BYTES
    x_rows = x_ptr + offs_b[:, None].to(tl.int64) * K + offs_j[None, :]
    acc = tl.zeros([BLOCK_B, BLOCK_N], tl.float32)
    for blk in range(0, NB):
        bp = row_base + blk * 34
        lo = tl.load(bp, mask=mask_n, other=0).to(tl.uint16)
        hi = tl.load(bp + 1, mask=mask_n, other=0).to(tl.uint16)
        d = (lo | (hi << 8)).to(tl.float16, bitcast=True).to(tl.float32)
        q = tl.load(bp[None, :] + 2 + offs_j[:, None], mask=mask_n[None, :], other=0)
        xv = tl.load(x_rows + blk * 32, mask=mask_b[:, None], other=0.0)
        q = q.to(tl.int8, bitcast=True).to(xv.dtype)
        acc += tl.dot(xv, q, input_precision=PRECISION) * d[None, :]
    out_ptrs = out_ptr + offs_b[:, None].to(tl.int64) * N + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask_b[:, None] & mask_n[None, :])


def launch(out, w, x):
    B, K = x.shape
    N = w.shape[0]
    if B == 0 or N == 0:
        return
    NB = K // 32
    ROW_BYTES = w.shape[1]
    if B < 16:
        BLOCK_N = 16
        NBLK = max(1, min(8, triton.next_power_of_2(NB)))
        grid = (triton.cdiv(N, BLOCK_N), B)
        _q8_0_gemv_kernel[grid](out, w, x, N, K, NB, ROW_BYTES,
                                BLOCK_N=BLOCK_N, NBLK=NBLK, num_warps=4)
    else:
        fp32 = x.element_size() == 4
        BLOCK_B = min(32 if fp32 else 64, triton.next_power_of_2(B))
        BLOCK_N = 32 if fp32 else 64
        grid = (triton.cdiv(B, BLOCK_B), triton.cdiv(N, BLOCK_N))
        _q8_0_mm_kernel[grid](out, w, x, B, N, K, NB, ROW_BYTES,
                              BLOCK_B=BLOCK_B, BLOCK_N=BLOCK_N,
                              PRECISION="ieee" if fp32 else "tf32",
                              num_warps=4, num_stages=3)
