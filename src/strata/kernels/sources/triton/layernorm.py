# strata-kernel: op=layernorm dialect=triton entry=launch dtypes=float32,bfloat16,float16
"""layernorm (triton): out = (x - mean) / sqrt(var + eps) * w + b over the last dim
(biased variance).

One program per row. Rows of <= 8192 elements are loaded once and normalised in
registers (mean, then centred variance). Longer rows are walked in BLOCK chunks three
times: sum -> mean, sum of (x - mean)^2 -> variance, then normalise and store. Masked
lanes load 0 and are excluded from the variance. float32 arithmetic; stored in out's
dtype.
"""
import triton
import triton.language as tl


@triton.jit
def _layernorm_kernel(out_ptr, x_ptr, w_ptr, b_ptr, C, eps,
                      BLOCK: tl.constexpr, SINGLE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * C
    o_row = out_ptr + row * C
    cols = tl.arange(0, BLOCK)
    if SINGLE:
        mask = cols < C
        x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
        mean = tl.sum(x, axis=0) / C
        d = tl.where(mask, x - mean, 0.0)
        var = tl.sum(d * d, axis=0) / C
        rstd = 1.0 / tl.sqrt(var + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(o_row + cols, (d * rstd * w + b).to(out_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([BLOCK], tl.float32)
        for start in range(0, C, BLOCK):
            offs = start + cols
            acc += tl.load(x_row + offs, mask=offs < C, other=0.0).to(tl.float32)
        mean = tl.sum(acc, axis=0) / C
        acc = tl.zeros([BLOCK], tl.float32)
        for start in range(0, C, BLOCK):
            offs = start + cols
            mask = offs < C
            x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
            d = tl.where(mask, x - mean, 0.0)
            acc += d * d
        var = tl.sum(acc, axis=0) / C
        rstd = 1.0 / tl.sqrt(var + eps)
        for start in range(0, C, BLOCK):
            offs = start + cols
            mask = offs < C
            x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            y = (x - mean) * rstd * w + b
            tl.store(o_row + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def launch(out, x, w, b, eps=1e-5):
    R, C = x.shape
    if R == 0 or C == 0:
        return
    BLOCK = min(triton.next_power_of_2(C), 8192)
    single = C <= BLOCK
    if not single:
        BLOCK = 4096
    num_warps = 4 if BLOCK <= 1024 else (8 if BLOCK <= 4096 else 16)
    _layernorm_kernel[(R,)](out, x, w, b, C, float(eps),
                            BLOCK=BLOCK, SINGLE=single, num_warps=num_warps)
