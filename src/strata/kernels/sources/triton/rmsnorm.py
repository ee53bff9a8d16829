# strata-kernel: op=rmsnorm dialect=triton entry=launch dtypes=float32,bfloat16,float16
"""rmsnorm (triton): out = x / sqrt(mean(x^2) + eps) * w over the last dim.

One program per row. Rows of <= 8192 elements are loaded once (sum of squares, then
scale in registers); longer rows are walked in BLOCK chunks twice (sum of squares, then
normalise and store). Masked lanes load 0. float32 arithmetic; stored in out's dtype.
"""
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(out_ptr, x_ptr, w_ptr, C, eps, BLOCK: tl.constexpr, SINGLE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * C
    o_row = out_ptr + row * C
    cols = tl.arange(0, BLOCK)
    if SINGLE:
        mask = cols < C
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / C + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(o_row + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK], tl.float32)
        for start in range(0, C, BLOCK):
            offs = start + cols
            x = tl.load(x_row + offs, mask=offs < C, other=0.0).to(tl.float32)
            acc += x * x
        rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / C + eps)
        for start in range(0, C, BLOCK):
            offs = start + cols
            mask = offs < C
            x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(o_row + offs, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def launch(out, x, w, eps=1e-6):
    R, C = x.shape
    if R == 0 or C == 0:
        return
    BLOCK = min(triton.next_power_of_2(C), 8192)
    single = C <= BLOCK
    if not single:
        BLOCK = 4096
    num_warps = 4 if BLOCK <= 1024 else (8 if BLOCK <= 4096 else 16)
    _rmsnorm_kernel[(R,)](out, x, w, C, float(eps),
                          BLOCK=BLOCK, SINGLE=single, num_warps=num_warps)
