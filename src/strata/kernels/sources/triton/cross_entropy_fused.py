# strata-kernel: op=cross_entropy_fused dialect=triton entry=launch dtypes=float32,bfloat16,float16
"""cross_entropy_fused (triton): per-row loss and dlogits in one launch, chunked over V.

out = [loss (R) | dlogits (R*V)] (flat, float32 like the loss of `cross_entropy`):
loss[r] = logsumexp(logits[r]) - logits[r, target[r]], dlogits[r] = softmax(logits[r]) -
onehot(target[r]). One program per row walks the row in BLOCK chunks (up to 4096, any V):
pass 1 keeps a per-lane running max and a sum rescaled by exp(m_old - m_new) (masked lanes
load -inf), merged across lanes at the end; pass 2 writes exp(x - max) / sum per chunk and
subtracts 1 at the target. Only one chunk of probabilities exists at any time. A target
outside [0, V) (ignore_index) gives loss 0 and a zero row. float32 arithmetic.
"""
import triton
import triton.language as tl


@triton.jit
def _ce_fused_kernel(out_ptr, logits_ptr, target_ptr, R, V, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * V
    grad = out_ptr + R + row * V
    cols = tl.arange(0, BLOCK)
    t = tl.load(target_ptr + row)
    ok = (t >= 0) & (t < V)
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
    inv = 1.0 / s
    keep = tl.where(ok, 1.0, 0.0)
    for start in range(0, V, BLOCK):
        offs = start + cols
        x = tl.load(base + offs, mask=offs < V, other=0.0).to(tl.float32)
        g = tl.exp(x - m) * inv - tl.where(offs == t, 1.0, 0.0)
        tl.store(grad + offs, (g * keep).to(out_ptr.dtype.element_ty), mask=offs < V)
    x_t = tl.load(base + tl.where(ok, t, 0)).to(tl.float32)
    loss = tl.where(ok, m + tl.log(s) - x_t, 0.0)
    tl.store(out_ptr + row, loss.to(out_ptr.dtype.element_ty))


def launch(out, logits, target):
    R, V = logits.shape
    if R == 0 or V == 0:
        return
    BLOCK = max(16, min(triton.next_power_of_2(V), 4096))
    num_warps = 4 if BLOCK <= 1024 else 8
    _ce_fused_kernel[(R,)](out, logits, target, R, V, BLOCK=BLOCK, num_warps=num_warps)
