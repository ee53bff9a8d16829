# strata-kernel: op=cross_entropy dialect=triton entry=launch dtypes=float32,bfloat16,float16
"""cross_entropy (triton): out[r] = logsumexp(logits[r,:]) - logits[r, target[r]] (fp32).

One program per row. The row is walked in BLOCK chunks (up to 4096, so any vocabulary
size works, e.g. 151936) with an online logsumexp: a per-lane running max and a sum
rescaled by exp(m_old - m_new) (masked lanes load -inf); lanes are merged at the end.
The target logit is a single masked load; an out-of-range target yields NaN instead of
an out-of-bounds read. float32 arithmetic.
"""
import triton
import triton.language as tl


@triton.jit
def _cross_entropy_kernel(out_ptr, logits_ptr, target_ptr, V, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * V
    cols = tl.arange(0, BLOCK)
    m_vec = tl.full([BLOCK], float("-inf"), tl.float32)
    s_vec = tl.zeros([BLOCK], tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + cols
        x = tl.load(base + offs, mask=offs < V, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m_vec, x)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s_vec = s_vec * tl.exp(m_vec - m_safe) + tl.exp(x - m_safe)
        m_vec = m_new
    m = tl.max(m_vec, axis=0)
    s = tl.sum(s_vec * tl.exp(m_vec - m), axis=0)
    lse = m + tl.log(s)
    t = tl.load(target_ptr + row)
    ok = (t >= 0) & (t < V)
    x_t = tl.load(base + tl.where(ok, t, 0), mask=ok, other=float("nan")).to(tl.float32)
    tl.store(out_ptr + row, (lse - x_t).to(out_ptr.dtype.element_ty))


def launch(out, logits, target):
    R, V = logits.shape
    if R == 0:
        return
    BLOCK = max(16, min(triton.next_power_of_2(V), 4096))
    num_warps = 4 if BLOCK <= 1024 else 8
    _cross_entropy_kernel[(R,)](out, logits, target, V, BLOCK=BLOCK, num_warps=num_warps)
