# strata-kernel: op=swiglu_oai dialect=triton entry=launch dtypes=float32
"""swiglu_oai (triton): gpt-oss's clamped SwiGLU, elementwise in float32, as ggml's CPU kernel:
x = min(a, 7) (a NaN stays NaN, as std::min(a, limit) returns a when the comparison fails),
y = clamp(b, -7, 7), out = x / (1 + exp(1.702 * -x)) * (y + 1).

The tensors are one flat array; one program per BLOCK (1024) contiguous elements, the tail
masked. The comparisons are written as the C reference's, so NaN and ±inf go the same way.
"""
import triton
import triton.language as tl


@triton.jit
def _swiglu_oai_kernel(out_ptr, a_ptr, b_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(a_ptr + offs, mask=mask, other=0.0)
    b = tl.load(b_ptr + offs, mask=mask, other=0.0)
    x = tl.where(a > 7.0, 7.0, a)
    y = tl.where(b < -7.0, -7.0, tl.where(b > 7.0, 7.0, b))
    out = x / (1.0 + tl.exp(1.702 * -x)) * (y + 1.0)
    tl.store(out_ptr + offs, out, mask=mask)


def launch(out, a, b):
    n = a.numel()
    if n == 0:
        return
    BLOCK = 1024
    _swiglu_oai_kernel[(triton.cdiv(n, BLOCK),)](out, a, b, n, BLOCK=BLOCK, num_warps=4)
