# strata-kernel: op=conv2d_nhwc dialect=triton entry=launch dtypes=float32
"""conv2d_nhwc (triton): channels-last conv2d with stride, zero padding and groups, + bias.

Grid (cdiv(N·Ho·Wo, BP), cdiv(CO, BO)): each program owns BP output pixels x BO output
channels in registers and walks the K x K taps and its group's C/G input channels, one rank-1
update each; taps outside the image load as zeros (the padding), ragged tails masked. S and
P are read from geom on the host (one small copy per launch). float32 arithmetic.
"""
import triton
import triton.language as tl


@triton.jit
def _conv_kernel(out_ptr, x_ptr, w_ptr, b_ptr, H, W, C, CO, Ho, Wo, pixels, S, P, cg, og,
                 K: tl.constexpr, BP: tl.constexpr, BO: tl.constexpr):
    p = tl.program_id(0) * BP + tl.arange(0, BP)
    o = tl.program_id(1) * BO + tl.arange(0, BO)
    p_ok, o_ok = p < pixels, o < CO
    n = p // (Ho * Wo)
    i = (p // Wo) % Ho
    j = p % Wo
    c0 = (o // og) * cg  # each output channel's group's first input channel
    acc = tl.zeros((BP, BO), dtype=tl.float32) + \
        tl.load(b_ptr + o, mask=o_ok, other=0.0).to(tl.float32)[None, :]
    for kh in range(0, K):
        r = i * S - P + kh
        for kw in range(0, K):
            q = j * S - P + kw
            inside = p_ok & (r >= 0) & (r < H) & (q >= 0) & (q < W)
            row = ((n * H + r) * W + q).to(tl.int64) * C
            for c in range(0, cg):
                xv = tl.load(x_ptr + row[:, None] + (c0 + c)[None, :],
                             mask=inside[:, None] & o_ok[None, :], other=0.0)
                wv = tl.load(w_ptr + ((o * K + kh) * K + kw) * cg + c, mask=o_ok, other=0.0)
                acc += xv.to(tl.float32) * wv.to(tl.float32)[None, :]
    dst = p.to(tl.int64)[:, None] * CO + o[None, :]
    tl.store(out_ptr + dst, acc.to(out_ptr.dtype.element_ty), mask=p_ok[:, None] & o_ok[None, :])


def launch(out, x, w, b, geom):
    N, H, W, C = x.shape
    CO, K = w.shape[0], w.shape[1]
    Ho, Wo = out.shape[1], out.shape[2]
    pixels = N * Ho * Wo
    if pixels == 0 or CO == 0:
        return
    S, P = (int(v) for v in geom.tolist())
    cg = w.shape[3]
    BP, BO = 32, min(64, triton.next_power_of_2(CO))
    _conv_kernel[(triton.cdiv(pixels, BP), triton.cdiv(CO, BO))](
        out, x, w, b, H, W, C, CO, Ho, Wo, pixels, S, P, cg, CO // (C // cg), K=K, BP=BP,
        BO=BO, num_warps=4)
