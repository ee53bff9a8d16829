# strata-kernel: op=conv1d_causal_step dialect=triton entry=launch dtypes=float32
"""conv1d_causal_step (triton): one decode step, out = [new state | y].

Grid cdiv(B·C, BLOCK): each program takes BLOCK (b, c) rows: y = bias + the K-1 state taps
+ the newest tap on x, and the row's state moved down by one with x appended. float32.
"""
import triton
import triton.language as tl


@triton.jit
def _step_kernel(out_ptr, state_ptr, x_ptr, w_ptr, b_ptr, N, C, K, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    inside = rows < N
    c = rows % C
    S = K - 1
    xv = tl.load(x_ptr + rows, mask=inside, other=0.0).to(tl.float32)
    acc = tl.load(b_ptr + c, mask=inside, other=0.0).to(tl.float32)
    for k in range(0, S):
        sv = tl.load(state_ptr + rows * S + k, mask=inside, other=0.0).to(tl.float32)
        acc += tl.load(w_ptr + c * K + k, mask=inside, other=0.0).to(tl.float32) * sv
        if k > 0:  # the state moves down by one: slot k-1 takes slot k
            tl.store(out_ptr + rows * S + k - 1, sv.to(out_ptr.dtype.element_ty), mask=inside)
    acc += tl.load(w_ptr + c * K + S, mask=inside, other=0.0).to(tl.float32) * xv
    tl.store(out_ptr + rows * S + S - 1, xv.to(out_ptr.dtype.element_ty), mask=inside)
    tl.store(out_ptr + N * S + rows, acc.to(out_ptr.dtype.element_ty), mask=inside)


def launch(out, state, x, w, b):
    B, C = x.shape
    K = w.shape[1]
    N = B * C
    if N == 0:
        return
    BLOCK = min(1024, triton.next_power_of_2(N))
    _step_kernel[(triton.cdiv(N, BLOCK),)](out, state, x, w, b, N, C, K, BLOCK=BLOCK,
                                           num_warps=4)
