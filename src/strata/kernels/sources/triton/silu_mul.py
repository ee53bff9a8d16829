# strata-kernel: op=silu_mul dialect=triton entry=launch dtypes=float32,bfloat16,float16
"""silu_mul (triton): out = silu(a) * b = a / (1 + exp(-a)) * b, elementwise.

The [R,C] tensors are treated as one flat array of R*C elements; one program per
BLOCK (1024) contiguous elements, the tail masked. float32 arithmetic; stored in out's
dtype.
"""
import triton
import triton.language as tl


@triton.jit
def _silu_mul_kernel(out_ptr, a_ptr, b_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    y = a / (1.0 + tl.exp(-a)) * b
    tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def launch(out, a, b):
    n = a.numel()
    if n == 0:
        return
    BLOCK = 1024
    _silu_mul_kernel[(triton.cdiv(n, BLOCK),)](out, a, b, n, BLOCK=BLOCK, num_warps=4)
