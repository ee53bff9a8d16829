# strata-kernel: op=rope_backward dialect=triton entry=launch dtypes=float32,bfloat16,float16
"""rope_backward (triton): the gradient of Llama/NeoX rotate-half RoPE, the inverse rotation.

For dy[T,H,D], cos/sin[T,D/2] and i < D/2:
  out[t,h,i]       = dy[t,h,i] * cos[t,i] + dy[t,h,i+D/2] * sin[t,i]
  out[t,h,i+D/2]   = dy[t,h,i+D/2] * cos[t,i] - dy[t,h,i] * sin[t,i]

Grid (T, cdiv(H, BLOCK_H)): each program loads the cos/sin row of its position once and
rotates a [BLOCK_H, BLOCK_HALF] tile of heads x half-dims back, masked on heads and on D/2.
float32 arithmetic; stored in out's dtype.
"""
import triton
import triton.language as tl


@triton.jit
def _rope_backward_kernel(out_ptr, dy_ptr, cos_ptr, sin_ptr, H, D, HALF,
                          BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_i = tl.arange(0, BLOCK_HALF)
    mask_i = offs_i < HALF
    c = tl.load(cos_ptr + t * HALF + offs_i, mask=mask_i, other=0.0).to(tl.float32)
    s = tl.load(sin_ptr + t * HALF + offs_i, mask=mask_i, other=0.0).to(tl.float32)
    mask = (offs_h[:, None] < H) & mask_i[None, :]
    base = t * H * D + offs_h[:, None] * D + offs_i[None, :]
    g1 = tl.load(dy_ptr + base, mask=mask, other=0.0).to(tl.float32)
    g2 = tl.load(dy_ptr + base + HALF, mask=mask, other=0.0).to(tl.float32)
    o1 = g1 * c[None, :] + g2 * s[None, :]
    o2 = g2 * c[None, :] - g1 * s[None, :]
    tl.store(out_ptr + base, o1.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + base + HALF, o2.to(out_ptr.dtype.element_ty), mask=mask)


def launch(out, dy, cos, sin):
    T, H, D = dy.shape
    HALF = D // 2
    if T == 0 or H == 0 or HALF == 0:
        return
    BLOCK_HALF = triton.next_power_of_2(HALF)
    BLOCK_H = max(1, min(triton.next_power_of_2(H), 4096 // BLOCK_HALF))
    grid = (T, triton.cdiv(H, BLOCK_H))
    _rope_backward_kernel[grid](out, dy, cos, sin, H, D, HALF,
                                BLOCK_H=BLOCK_H, BLOCK_HALF=BLOCK_HALF, num_warps=4)
