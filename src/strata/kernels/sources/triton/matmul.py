# strata-kernel: op=matmul dialect=triton entry=launch dtypes=float32,bfloat16,float16
"""matmul (triton): out[M,N] = a[M,K] @ b[K,N].

Tiled GEMM: one program per BLOCK_M x BLOCK_N output tile, grouped (GROUP_M) launch
order so neighbouring programs share A row-panels in L2. Each program walks K in
BLOCK_K steps, loads masked tiles of a and b (other=0 for ragged edges) and accumulates
with ``tl.dot`` into a float32 accumulator; the tile is stored in out's dtype.

Defaults target H100/H200-class GPUs: 128x128 tiles, BLOCK_K=64 for 16-bit inputs
(32 for float32, to keep 3 pipeline stages within shared memory), num_warps=8,
num_stages=3. For small problems the launcher shrinks the tiles (never below 16, the
minimum ``tl.dot`` shape). float32 inputs use ``input_precision="ieee"`` (exact fp32,
no TF32 rounding); bfloat16/float16 use the tensor cores' native precision.
"""
import triton
import triton.language as tl


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                   stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_M: tl.constexpr, PRECISION: tl.constexpr):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    mask_m = offs_m < M
    mask_n = offs_n < N

    a_ptrs = a_ptr + offs_m[:, None].to(tl.int64) * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None].to(tl.int64) * stride_bk + offs_n[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_rem = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=mask_m[:, None] & (offs_k[None, :] < k_rem), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_rem) & mask_n[None, :], other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c_ptrs = c_ptr + offs_m[:, None].to(tl.int64) * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def _block(n, cap):
    return max(16, min(cap, triton.next_power_of_2(max(n, 1))))


def launch(out, a, b):
    M, K = a.shape
    N = b.shape[1]
    if M == 0 or N == 0:
        return
    fp32 = a.element_size() == 4
    BLOCK_M = _block(M, 128)
    BLOCK_N = _block(N, 128)
    BLOCK_K = _block(K, 32 if fp32 else 64)
    big = BLOCK_M * BLOCK_N >= 128 * 128
    grid = (triton.cdiv(M, BLOCK_M) * triton.cdiv(N, BLOCK_N),)
    _matmul_kernel[grid](
        a, b, out, M, N, K,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, GROUP_M=8,
        PRECISION="ieee" if fp32 else "tf32",
        num_warps=8 if big else 4, num_stages=3,
    )
