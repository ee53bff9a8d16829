# strata-kernel: op=linear_f32 dialect=triton entry=launch dtypes=float32
"""linear_f32 (triton): out[b,n] = sum_k x[b,k] * w[n,k], x [B,K], w [N,K] (a GGUF F32
weight as stored: row n holds output n's K weights).

Decode path (B < 16): grid (cdiv(N, BLOCK_N), B); each program computes BLOCK_N outputs
of one x row, walking K in BLOCK_K chunks: a [BLOCK_N, BLOCK_K] weight tile times the x
chunk, summed along K into a float32 accumulator.
Batched path (B >= 16): grid (cdiv(B, BLOCK_B), cdiv(N, BLOCK_N)); x tile [BLOCK_B,
BLOCK_K] @ w tile read transposed [BLOCK_K, BLOCK_N] by ``tl.dot`` with exact float32
products (input_precision="ieee", no TF32), float32 accumulator. Ragged edges are masked.
"""
import triton
import triton.language as tl


@triton.jit
def _gemv_kernel(out_ptr, x_ptr, w_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    b = tl.program_id(1).to(tl.int64)
    mask_n = offs_n < N
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * K
    acc = tl.zeros([BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        xv = tl.load(x_ptr + b * K + offs_k, mask=mask_k, other=0.0).to(tl.float32)
        wv = tl.load(w_rows + offs_k[None, :], mask=mask_n[:, None] & mask_k[None, :],
                     other=0.0).to(tl.float32)
        acc += tl.sum(wv * xv[None, :], axis=1)
    tl.store(out_ptr + b * N + offs_n, acc.to(out_ptr.dtype.element_ty), mask=mask_n)


@triton.jit
def _mm_kernel(out_ptr, x_ptr, w_ptr, B, N, K, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr):
    offs_b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_b = offs_b < B
    mask_n = offs_n < N
    x_rows = x_ptr + offs_b[:, None].to(tl.int64) * K
    w_cols = w_ptr + offs_n[None, :].to(tl.int64) * K
    acc = tl.zeros([BLOCK_B, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        mask_k = offs_k < K
        xt = tl.load(x_rows + offs_k[None, :], mask=mask_b[:, None] & mask_k[None, :],
                     other=0.0)
        wt = tl.load(w_cols + offs_k[:, None], mask=mask_k[:, None] & mask_n[None, :],
                     other=0.0)
        acc = tl.dot(xt, wt, acc, input_precision="ieee")
    out_ptrs = out_ptr + offs_b[:, None].to(tl.int64) * N + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask_b[:, None] & mask_n[None, :])


def launch(out, x, w):
    B, K = x.shape
    N = w.shape[0]
    if B == 0 or N == 0:
        return
    if B < 16:
        BLOCK_N, BLOCK_K = 32, max(16, min(256, triton.next_power_of_2(K)))
        _gemv_kernel[(triton.cdiv(N, BLOCK_N), B)](out, x, w, N, K, BLOCK_N=BLOCK_N,
                                                    BLOCK_K=BLOCK_K, num_warps=4)
    else:
        BLOCK_B, BLOCK_N, BLOCK_K = min(64, triton.next_power_of_2(B)), 64, 32
        grid = (triton.cdiv(B, BLOCK_B), triton.cdiv(N, BLOCK_N))
        _mm_kernel[grid](out, x, w, B, N, K, BLOCK_B=BLOCK_B, BLOCK_N=BLOCK_N,
                         BLOCK_K=BLOCK_K, num_warps=4, num_stages=3)
