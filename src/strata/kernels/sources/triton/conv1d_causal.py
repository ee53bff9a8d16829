# strata-kernel: op=conv1d_causal dialect=triton entry=launch dtypes=float32
"""conv1d_causal (triton): the causal depthwise conv1d over x[B,C,T] with w[C,K] and b[C].

Grid (B·C, cdiv(T, BLOCK)): each program filters BLOCK positions of one row with its
channel's K taps, loading x shifted by each tap; positions before t = 0 load as zeros (the
causal padding), the tail masked. float32 arithmetic.
"""
import triton
import triton.language as tl


@triton.jit
def _conv_kernel(out_ptr, x_ptr, w_ptr, b_ptr, C, T, K, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    c = r % C
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < T
    acc = tl.zeros((BLOCK,), dtype=tl.float32) + tl.load(b_ptr + c).to(tl.float32)
    for k in range(0, K):
        src = offs - (K - 1) + k
        xv = tl.load(x_ptr + r * T + src, mask=inside & (src >= 0), other=0.0)
        acc += tl.load(w_ptr + c * K + k).to(tl.float32) * xv.to(tl.float32)
    tl.store(out_ptr + r * T + offs, acc.to(out_ptr.dtype.element_ty), mask=inside)


def launch(out, x, w, b):
    B, C, T = x.shape
    K = w.shape[1]
    if B * C * T == 0:
        return
    BLOCK = min(1024, triton.next_power_of_2(T))
    _conv_kernel[(B * C, triton.cdiv(T, BLOCK))](out, x, w, b, C, T, K, BLOCK=BLOCK,
                                                 num_warps=4)
