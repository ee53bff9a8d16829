# strata-kernel: op=attention dialect=triton entry=launch dtypes=float32,bfloat16,float16
"""attention (triton): causal prefill attention, flash-attention style, with GQA.

out[h] = softmax(q[h] @ k[g]^T * scale + causal mask) @ v[g], g = h // (H // Hkv).

Grid (cdiv(T, BLOCK_M), H): each program owns BLOCK_M query rows of one head, keeps
them in registers and walks the keys/values of its kv head in BLOCK_N blocks up to the
causal limit (end of its own query block). Scores come from ``tl.dot`` (float32
accumulator), are masked (causal and ragged T -> -inf), and folded into a running row
max m_i, running sum l_i and a float32 output accumulator rescaled by exp(m_old - m_new)
(online softmax, computed with exp2 and scale*log2(e)). The head dim is padded to a
power of two >= 16 and masked. Probabilities are cast to v's dtype before the P@V dot
(float32 stays exact via input_precision="ieee"). Because key 0 is visible to every
query row, every row's running max is finite after the first block, so no NaN appears.

Defaults for H100/H200 (head dim <= 128): 16-bit inputs 128x64 blocks, 8 warps,
3 stages; float32 (exact fp32 dots, no tensor cores) 64x32, 8 warps, 2 stages, chosen
to stay within 255 registers without spilling. Blocks shrink (>= 16) for short sequences.
"""
import triton
import triton.language as tl


@triton.jit
def _attention_kernel(out_ptr, q_ptr, k_ptr, v_ptr, H, T, D, GROUP, qk_scale,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                      PRECISION: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1)
    g = h // GROUP
    q_base = q_ptr + h.to(tl.int64) * T * D
    k_base = k_ptr + g.to(tl.int64) * T * D
    v_base = v_ptr + g.to(tl.int64) * T * D
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
    _attention_kernel[grid](out, q, k, v, H, T, D, H // Hkv, float(scale) * 1.4426950408889634,
                            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D,
                            PRECISION="ieee" if fp32 else "tf32",
                            num_warps=warps, num_stages=stages)
