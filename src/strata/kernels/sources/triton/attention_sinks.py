# strata-kernel: op=attention_sinks dialect=triton entry=launch dtypes=float32
"""attention_sinks (triton): gpt-oss's attention of T queries over a KV cache with a sink
logit per head, GQA, optionally windowed.

q [H,T,D]; k, v [Hkv,C,D]; pos int64 [2]: P = pos[0] cache rows precede the queries, W =
pos[1]; sinks [H]. Query t of head h attends rows max(0, P+t-W+1)..P+t (W > 0) or 0..P+t
(W = 0) of kv head h // (H // Hkv); the sink's e^(sink - m) joins the softmax's sum only (no
value, not scaled by `scale`), as ggml's soft_max with sinks.

attention_cached's program (grid (cdiv(T, BLOCK_M), H), P and W read on the device, keys in
BLOCK_N blocks, scores by tl.dot with float32 accumulation, an online softmax in exp2 with
scale*log2(e)) with two changes: the key loop starts at the block's first row's window start,
and the running max and sum start from the sink (m = sink*log2(e), l = 1) rather than from
-inf and 0. A row whose keys in some block are all outside its window, with a sink of -inf,
has a running max of -inf there: the exponentials then use 0 in its place (the row's sum and
output stay 0 until its first key), so no NaN comes from -inf - -inf.
"""
import triton
import triton.language as tl


@triton.jit
def _attention_sinks_kernel(out_ptr, q_ptr, k_ptr, v_ptr, pos_ptr, sinks_ptr, T, C, D, GROUP,
                            qk_scale, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_D: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1)
    g = h // GROUP
    P = tl.load(pos_ptr)
    W = tl.maximum(tl.load(pos_ptr + 1), 0)
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

    sink = tl.load(sinks_ptr + h) * 1.4426950408889634  # log2 domain, as the scores
    m_i = tl.full([BLOCK_M], 0.0, tl.float32) + sink
    l_i = tl.where(m_i == float("-inf"), 0.0, 1.0)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    last = P + offs_m  # each row's own position: its last key
    first = tl.where(W > 0, tl.maximum(last - W + 1, 0), 0)
    lo = tl.where(W > 0, tl.maximum(P + start_m - W + 1, 0), 0)
    hi = P + tl.minimum(start_m + BLOCK_M, T)
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        mask_n = cols < hi
        kt = tl.load(k_base + cols[None, :].to(tl.int64) * D + offs_d[:, None],
                     mask=mask_d[:, None] & mask_n[None, :], other=0.0)
        s = tl.dot(q, kt, input_precision="ieee") * qk_scale
        valid = (cols[None, :] <= last[:, None]) & (cols[None, :] >= first[:, None]) & \
            mask_n[None, :]
        s = tl.where(valid, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_base + cols[:, None].to(tl.int64) * D + offs_d[None, :],
                    mask=mask_n[:, None] & mask_d[None, :], other=0.0)
        acc = acc * alpha[:, None]
        acc = tl.dot(p, v, acc, input_precision="ieee")
        m_i = m_new

    acc = acc / l_i[:, None]
    tl.store(o_base + offs_m[:, None] * D + offs_d[None, :], acc,
             mask=mask_m[:, None] & mask_d[None, :])


def launch(out, q, k, v, pos, sinks, scale=None):
    H, T, D = q.shape
    Hkv = k.shape[0]
    C = k.shape[1]
    if H == 0 or T == 0 or D == 0:
        return
    if scale is None:
        scale = D ** -0.5
    BLOCK_D = max(16, triton.next_power_of_2(D))
    BLOCK_N = 16 if BLOCK_D > 128 else 32
    BLOCK_M = min(64, max(16, triton.next_power_of_2(T)))
    grid = (triton.cdiv(T, BLOCK_M), H)
    _attention_sinks_kernel[grid](out, q, k, v, pos, sinks, T, C, D, H // Hkv,
                                  float(scale) * 1.4426950408889634,
                                  BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_D=BLOCK_D,
                                  num_warps=4 if BLOCK_M <= 16 else 8, num_stages=2)
