# strata-kernel: op=rmsnorm_backward dialect=triton entry=launch dtypes=float32,bfloat16,float16
"""rmsnorm_backward (triton): out = [dx (R*C) | dw (C)] for y = x / sqrt(mean(x^2)+eps) * w.

With r = 1/sqrt(mean(x^2)+eps) and g = dy*w per row: dx = r*g - x*r^3*mean(g*x) and
dw = sum over rows of dy*x*r.

Two launches. The first runs one program per block of BR rows (BR fixed by the shape, not
by the device): it writes dx for its rows and the block's dw partial into a float32 scratch
row of its own (kept in registers while a row fits in one BLOCK, else read-modify-written by
its only owner). The second sums the partials in block order per column chunk. No atomics:
the result is the same bits on every run. float32 arithmetic; stored in out's dtype.
"""
import torch
import triton
import triton.language as tl

MAX_BLOCKS = 256  # dw partials at most (bounds the scratch)
MIN_BLOCK_ROWS = 32


@triton.jit
def _rows_kernel(out_ptr, part_ptr, x_ptr, w_ptr, dy_ptr, R, C, BR, eps,
                 BLOCK: tl.constexpr, SINGLE: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    part = part_ptr + b * C
    r0 = b * BR
    r1 = tl.minimum(r0 + BR, R)
    if SINGLE:
        mask = cols < C
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        acc = tl.zeros([BLOCK], tl.float32)
        for r in range(r0, r1):
            x = tl.load(x_ptr + r * C + cols, mask=mask, other=0.0).to(tl.float32)
            dy = tl.load(dy_ptr + r * C + cols, mask=mask, other=0.0).to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / C + eps)
            k = rstd * rstd * rstd * tl.sum(dy * w * x, axis=0) / C
            dx = rstd * dy * w - k * x
            tl.store(out_ptr + r * C + cols, dx.to(out_ptr.dtype.element_ty), mask=mask)
            acc += dy * x * rstd
        tl.store(part + cols, acc, mask=mask)
    else:
        for start in range(0, C, BLOCK):
            tl.store(part + start + cols, tl.zeros([BLOCK], tl.float32),
                     mask=start + cols < C)
        for r in range(r0, r1):
            ss = tl.zeros([BLOCK], tl.float32)
            gx = tl.zeros([BLOCK], tl.float32)
            for start in range(0, C, BLOCK):
                offs = start + cols
                mask = offs < C
                x = tl.load(x_ptr + r * C + offs, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + r * C + offs, mask=mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
                ss += x * x
                gx += dy * w * x
            rstd = 1.0 / tl.sqrt(tl.sum(ss, axis=0) / C + eps)
            k = rstd * rstd * rstd * tl.sum(gx, axis=0) / C
            for start in range(0, C, BLOCK):
                offs = start + cols
                mask = offs < C
                x = tl.load(x_ptr + r * C + offs, mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(dy_ptr + r * C + offs, mask=mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
                dx = rstd * dy * w - k * x
                tl.store(out_ptr + r * C + offs, dx.to(out_ptr.dtype.element_ty), mask=mask)
                p = tl.load(part + offs, mask=mask, other=0.0)
                tl.store(part + offs, p + dy * x * rstd, mask=mask)


@triton.jit
def _combine_kernel(out_ptr, part_ptr, NB, C, dw_offset, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < C
    acc = tl.zeros([BLOCK], tl.float32)
    for b in range(0, NB):
        acc += tl.load(part_ptr + b * C + offs, mask=mask, other=0.0)
    tl.store(out_ptr + dw_offset + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def launch(out, x, w, dy, eps=1e-5):
    R, C = x.shape
    if C == 0:
        return
    br = max(MIN_BLOCK_ROWS, triton.cdiv(R, MAX_BLOCKS))
    nb = triton.cdiv(R, br)
    part = x.new_empty((max(nb, 1), C), dtype=torch.float32)  # per-block dw partials
    if nb:
        BLOCK = min(triton.next_power_of_2(C), 8192)
        single = C <= BLOCK
        if not single:
            BLOCK = 4096
        num_warps = 4 if BLOCK <= 1024 else (8 if BLOCK <= 4096 else 16)
        _rows_kernel[(nb,)](out, part, x, w, dy, R, C, br, float(eps),
                            BLOCK=BLOCK, SINGLE=single, num_warps=num_warps)
    CB = min(triton.next_power_of_2(C), 1024)
    _combine_kernel[(triton.cdiv(C, CB),)](out, part, nb, C, R * C, BLOCK=CB, num_warps=4)
