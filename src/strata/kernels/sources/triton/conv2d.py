# strata-kernel: op=conv2d dialect=triton entry=launch dtypes=float32
"""conv2d (triton): torch's NCHW conv2d with stride, zero padding and groups, + bias.

Grid (cdiv(N·Ho·Wo, BP), cdiv(CO, BO)): each program owns BP output pixels x BO output
channels in registers and walks its group's C/G input channels, BC at a time, and the K x K
taps (a [BP, BC, BO] product summed over BC); taps outside the image load as zeros (the
padding), ragged tails masked. S and P are read from geom inside the kernel. float32 arithmetic.
"""
import triton
import triton.language as tl


@triton.jit
def _conv_kernel(out_ptr, x_ptr, w_ptr, b_ptr, H, W, C, CO, Ho, Wo, pixels, geom_ptr, cg,
                 og, K: tl.constexpr, BP: tl.constexpr, BO: tl.constexpr, BC: tl.constexpr):
    S = tl.load(geom_ptr)  # stride and padding, read on the device
    P = tl.load(geom_ptr + 1)
    p = tl.program_id(0) * BP + tl.arange(0, BP)
    o = tl.program_id(1) * BO + tl.arange(0, BO)
    p_ok, o_ok = p < pixels, o < CO
    n = (p // (Ho * Wo)).to(tl.int64)
    i = (p // Wo) % Ho
    j = p % Wo
    c0 = (o // og) * cg  # each output channel's group's first input channel
    acc = tl.zeros((BP, BO), dtype=tl.float32) + \
        tl.load(b_ptr + o, mask=o_ok, other=0.0).to(tl.float32)[None, :]
    cc = tl.arange(0, BC)
    for cb in range(0, cg, BC):  # BC input channels at once: a [BP, BC, BO] product
        c_ok = (cb + cc) < cg
        chan = c0[None, :] + cb + cc[:, None]  # [BC, BO]: each output's input channel
        plane = (n[:, None, None] * C + chan[None, :, :]) * H  # [BP, BC, BO]: row 0 of it
        for kh in range(0, K):
            r = i * S - P + kh
            for kw in range(0, K):
                q = j * S - P + kw
                inside = p_ok & (r >= 0) & (r < H) & (q >= 0) & (q < W)
                xv = tl.load(x_ptr + (plane + r[:, None, None]) * W + q[:, None, None],
                             mask=inside[:, None, None] & (c_ok[:, None] & o_ok[None, :])[None],
                             other=0.0)
                wv = tl.load(w_ptr + ((o[None, :] * cg + cb + cc[:, None]) * K + kh) * K + kw,
                             mask=c_ok[:, None] & o_ok[None, :], other=0.0)
                acc += tl.sum(xv.to(tl.float32) * wv.to(tl.float32)[None, :, :], axis=1)
    pix = (i * Wo + j).to(tl.int64)
    dst = (n[:, None] * CO + o[None, :]) * (Ho * Wo) + pix[:, None]
    tl.store(out_ptr + dst, acc.to(out_ptr.dtype.element_ty), mask=p_ok[:, None] & o_ok[None, :])


def launch(out, x, w, b, geom):
    N, C, H, W = x.shape
    CO, cg, K = w.shape[0], w.shape[1], w.shape[2]
    Ho, Wo = out.shape[2], out.shape[3]
    pixels = N * Ho * Wo
    if pixels == 0 or CO == 0:
        return
    BP, BO = 32, min(64, triton.next_power_of_2(CO))
    BC = min(16, triton.next_power_of_2(cg))
    _conv_kernel[(triton.cdiv(pixels, BP), triton.cdiv(CO, BO))](
        out, x, w, b, H, W, C, CO, Ho, Wo, pixels, geom, cg, CO // (C // cg), K=K, BP=BP,
        BO=BO, BC=BC, num_warps=4)
