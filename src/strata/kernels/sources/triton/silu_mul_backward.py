# strata-kernel: op=silu_mul_backward dialect=triton entry=launch dtypes=float32,bfloat16,float16
"""silu_mul_backward (triton): out = [da (n) | db (n)], the gradients of silu(a) * b.

With s = sigmoid(a) and silu = a*s: da = dy*b*(s + silu*(1-s)), db = dy*silu. The [R,C]
inputs are one flat array of n elements; one program per BLOCK (1024) elements, the tail
masked, writing its da at out[offs] and its db at out[n + offs]. float32 arithmetic;
stored in out's dtype.
"""
import triton
import triton.language as tl


@triton.jit
def _silu_mul_backward_kernel(out_ptr, a_ptr, b_ptr, dy_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-a))
    silu = a * s
    da = dy * b * (s + silu * (1.0 - s))
    tl.store(out_ptr + offs, da.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + n + offs, (dy * silu).to(out_ptr.dtype.element_ty), mask=mask)


def launch(out, a, b, dy):
    n = a.numel()
    if n == 0:
        return
    BLOCK = 1024
    _silu_mul_backward_kernel[(triton.cdiv(n, BLOCK),)](out, a, b, dy, n, BLOCK=BLOCK,
                                                        num_warps=4)
