# strata-kernel: op=softmax dialect=triton entry=launch dtypes=float32,bfloat16,float16
"""softmax (triton): out[r,:] = softmax(x[r,:]) over the last dim.

One program per row. If the row fits in one BLOCK (<= 8192 elements) it is loaded once,
reduced in registers and written. Longer rows are processed in BLOCK chunks: pass 1
keeps a per-lane running max and rescaled sum (online softmax, masked lanes load -inf),
merged into the row max/sum at the end; pass 2 re-reads the row and writes
exp(x - max) / sum. All arithmetic is float32; the result is stored in out's dtype.
"""
import triton
import triton.language as tl


@triton.jit
def _softmax_kernel(out_ptr, x_ptr, C, BLOCK: tl.constexpr, SINGLE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * C
    o_row = out_ptr + row * C
    cols = tl.arange(0, BLOCK)
    if SINGLE:
        mask = cols < C
        x = tl.load(x_row + cols, mask=mask, other=float("-inf")).to(tl.float32)
        m = tl.max(x, axis=0)
        e = tl.exp(x - m)
        e = tl.where(mask, e, 0.0)
        s = tl.sum(e, axis=0)
        tl.store(o_row + cols, (e / s).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        m_vec = tl.full([BLOCK], float("-inf"), tl.float32)
        s_vec = tl.zeros([BLOCK], tl.float32)
        for start in range(0, C, BLOCK):
            offs = start + cols
            x = tl.load(x_row + offs, mask=offs < C, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m_vec, x)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            s_vec = s_vec * tl.exp(m_vec - m_safe) + tl.exp(x - m_safe)
            m_vec = m_new
        m = tl.max(m_vec, axis=0)
        s = tl.sum(s_vec * tl.exp(m_vec - m), axis=0)
        inv = 1.0 / s
        for start in range(0, C, BLOCK):
            offs = start + cols
            mask = offs < C
            x = tl.load(x_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
            y = tl.exp(x - m) * inv
            tl.store(o_row + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def launch(out, x):
    R, C = x.shape
    if R == 0 or C == 0:
        return
    BLOCK = min(triton.next_power_of_2(C), 8192)
    single = C <= BLOCK
    if not single:
        BLOCK = 4096
    num_warps = 4 if BLOCK <= 1024 else (8 if BLOCK <= 4096 else 16)
    _softmax_kernel[(R,)](out, x, C, BLOCK=BLOCK, SINGLE=single, num_warps=num_warps)
