# strata-kernel: op=attention_cached dialect=triton entry=launch dtypes=float32,bfloat16,float16
"""attention_cached (triton): causal attention of T queries over a KV cache, GQA.

q [H,T,D]; k, v [Hkv,C,D]; pos int64 [1]: P = pos[0] cache rows precede the queries
(P + T <= C). Query t of head h attends rows 0..P+t of kv head g = h // (H // Hkv).

Grid (cdiv(T, BLOCK_M), H): each program owns BLOCK_M query rows of one head and reads P
from pos on the device (no host sync: one launch serves every decode step). It walks the
keys of its kv head in BLOCK_N blocks up to its last row's limit P + min(end, T); loads
are masked there, so cache rows from P+T on are never read. Scores come from ``tl.dot``
(float32 accumulator, exact float32 dots via input_precision="ieee"), keys past a row's
own position get -inf, and an online softmax (running max, running sum, float32 output
accumulator rescaled by exp(m_old - m_new), computed with exp2 and scale*log2(e)) folds
each block in. Key 0 is visible to every row, so every running max is finite after the
first block. The head dim is padded to a power of two >= 16 and masked.
"""
import triton
import triton.language as tl


@triton.jit
def _attention_cached_kernel(out_ptr, q_ptr, k_ptr, v_ptr, pos_ptr, T, C, D, GROUP, qk_scale,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                             BLOCK_D: tl.constexpr, PRECISION: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1)
    g = h // GROUP
    P = tl.load(pos_ptr)
    q_base = q_ptr + h.to(tl.int64) * T * D
    k_base = k_ptr + g.to(tl.int64) * C * D
    v_base = v_ptr + g.to(tl.int64) * C * D
    o_base = out_ptr + h.to(tl.int64) * T * D

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < T
    mask_d = offs_d < D

    q = tl.load(q_base + offs_m[:, None] * D + offs_d[None, :],
                mask=mask_m[:, None] & mask_d[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    hi = P + tl.minimum(start_m + BLOCK_M, T)  # keys 0..hi-1: this block's last row's limit
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        mask_n = cols < hi
        kt = tl.load(k_base + cols[None, :].to(tl.int64) * D + offs_d[:, None],
                     mask=mask_d[:, None] & mask_n[None, :], other=0.0)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale
        valid = (cols[None, :] <= P + offs_m[:, None]) & mask_n[None, :]
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + cols[:, None].to(tl.int64) * D + offs_d[None, :],
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new

    acc = acc / l_i[:, None]
    tl.store(o_base + offs_m[:, None] * D + offs_d[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_d[None, :])


def launch(out, q, k, v, pos, scale=None):
    H, T, D = q.shape
    Hkv, C = k.shape[0], k.shape[1]
    if H == 0 or T == 0 or D == 0:
        return
    if scale is None:
        scale = D ** -0.5
    fp32 = q.element_size() == 4
    BLOCK_D = max(16, triton.next_power_of_2(D))
    bn = 16 if BLOCK_D > 128 else (32 if fp32 else 64)
    BLOCK_M = min(64, max(16, triton.next_power_of_2(T)))
    grid = (triton.cdiv(T, BLOCK_M), H)
    _attention_cached_kernel[grid](out, q, k, v, pos, T, C, D, H // Hkv,
                                   float(scale) * 1.4426950408889634,
                                   BLOCK_M=BLOCK_M, BLOCK_N=bn, BLOCK_D=BLOCK_D,
                                   PRECISION="ieee" if fp32 else "tf32",
                                   num_warps=4 if BLOCK_M <= 16 else 8, num_stages=2)
