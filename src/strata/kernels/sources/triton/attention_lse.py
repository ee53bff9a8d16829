# strata-kernel: op=attention_lse dialect=triton entry=launch dtypes=float32,bfloat16,float16
"""attention_lse (triton): causal GQA attention plus each query's logsumexp (training forward).

out = [o (H*T*D) | lse (H*T)] (flat), o[h] = softmax(q[h] @ k[g]^T * scale + causal mask)
@ v[g], g = h // (H // Hkv), lse[h, t] = logsumexp over s <= t of scale * q[h,t].k[g,s].

Grid (cdiv(T, BLOCK_M), H): each program owns BLOCK_M query rows of one head and walks the
keys/values of its kv head in BLOCK_N blocks up to the causal limit with an online softmax
(running max m_i and sum l_i in the log2 domain: scores are scaled by scale*log2(e) and
exponentiated with exp2). At the end o = acc / l_i and lse = (m_i + log2(l_i)) * ln(2).
Key 0 is visible to every row, so m_i is finite after the first block (no NaN). The head
dim is padded to a power of two >= 16 and masked; float32 dots are exact
(input_precision="ieee"), 16-bit inputs use tensor cores with float32 accumulators.
"""
import triton
import triton.language as tl


@triton.jit
def _attention_lse_kernel(out_ptr, q_ptr, k_ptr, v_ptr, T, D, GROUP, LSE_OFF, qk_scale,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                          PRECISION: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1)
    g = h // GROUP
    q_base = q_ptr + h.to(tl.int64) * T * D
    k_base = k_ptr + g.to(tl.int64) * T * D
    v_base = v_ptr + g.to(tl.int64) * T * D
    o_base = out_ptr + h.to(tl.int64) * T * D
    lse_base = out_ptr + LSE_OFF + h.to(tl.int64) * T  # lse follows o (H*T*D)

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

    hi = tl.minimum(start_m + BLOCK_M, T)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + offs_n
        mask_n = cols < T
        kt = tl.load(k_base + cols[None, :] * D + offs_d[:, None],
                     mask=mask_d[:, None] & mask_n[None, :], other=0.0)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale
        valid = (cols[None, :] <= offs_m[:, None]) & mask_n[None, :]
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + cols[:, None] * D + offs_d[None, :],
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)
        m_i = m_new

    acc = acc / l_i[:, None]
    tl.store(o_base + offs_m[:, None] * D + offs_d[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_d[None, :])
    lse = (m_i + tl.log2(l_i)) * 0.6931471805599453
    tl.store(lse_base + offs_m, lse.to(out_ptr.dtype.element_ty), mask=mask_m)


def launch(out, q, k, v, scale=None):
    H, T, D = q.shape
    Hkv = k.shape[0]
    if H == 0 or T == 0 or D == 0:
        return
    if scale is None:
        scale = D ** -0.5
    fp32 = q.element_size() == 4
    BLOCK_D = max(16, triton.next_power_of_2(D))
    if BLOCK_D > 128:
        bm, bn, warps, stages = 64, 16 if fp32 else 32, 8, 2
    elif fp32:
        bm, bn, warps, stages = 64, 32, 8, 2
    else:
        bm, bn, warps, stages = 128, 64, 8, 3
    tp = max(16, triton.next_power_of_2(T))
    BLOCK_M = min(bm, tp)
    BLOCK_N = min(bn, tp)
    grid = (triton.cdiv(T, BLOCK_M), H)
    _attention_lse_kernel[grid](out, q, k, v, T, D, H // Hkv, H * T * D,
                                float(scale) * 1.4426950408889634,
                                BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D,
                                PRECISION="ieee" if fp32 else "tf32",
                                num_warps=warps, num_stages=stages)
