# strata-kernel: op=decode_attention dialect=triton entry=launch dtypes=float32,bfloat16,float16
"""decode_attention (triton): one query per head over a KV cache of S positions (no
mask), with GQA: head h reads kv head h // (H // Hkv).

One program per query head. The program loads q[h] (head dim padded to a power of two
and masked), then walks the S cached positions in BLOCK_S chunks: scores are
row-wise dot products (broadcast multiply + sum, float32), masked lanes get -inf, and
an online softmax keeps a running max, running sum and a float32 [BLOCK_D] output
accumulator rescaled by exp(m_old - m_new) (computed with exp2 and scale*log2(e)).
"""
import triton
import triton.language as tl


@triton.jit
def _decode_attention_kernel(out_ptr, q_ptr, k_ptr, v_ptr, S, D, GROUP, qk_scale,
                             BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
    h = tl.program_id(0)
    g = h // GROUP
    k_base = k_ptr + g.to(tl.int64) * S * D
    v_base = v_ptr + g.to(tl.int64) * S * D
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D

    q = tl.load(q_ptr + h.to(tl.int64) * D + offs_d, mask=mask_d, other=0.0).to(tl.float32)
    q = q * qk_scale

    m_i = tl.max(tl.full([BLOCK_S], float("-inf"), tl.float32), axis=0)
    l_i = tl.sum(tl.zeros([BLOCK_S], tl.float32), axis=0)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for start in range(0, S, BLOCK_S):
        pos = start + offs_s
        mask_s = pos < S
        kv_off = pos[:, None].to(tl.int64) * D + offs_d[None, :]
        kv_mask = mask_s[:, None] & mask_d[None, :]
        k = tl.load(k_base + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
        s = tl.sum(k * q[None, :], axis=1)
        s = tl.where(mask_s, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        v = tl.load(v_base + kv_off, mask=kv_mask, other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        m_i = m_new

    acc = acc / l_i
    tl.store(out_ptr + h.to(tl.int64) * D + offs_d, acc.to(out_ptr.dtype.element_ty), mask=mask_d)


def launch(out, q, k, v, scale=None):
    H, D = q.shape
    Hkv, S = k.shape[0], k.shape[1]
    if H == 0 or D == 0:
        return
    if scale is None:
        scale = D ** -0.5
    BLOCK_D = triton.next_power_of_2(D)
    BLOCK_S = max(1, min(triton.next_power_of_2(S), max(16, 8192 // BLOCK_D)))
    _decode_attention_kernel[(H,)](out, q, k, v, S, D, H // Hkv,
                                   float(scale) * 1.4426950408889634,
                                   BLOCK_S=BLOCK_S, BLOCK_D=BLOCK_D, num_warps=4)
