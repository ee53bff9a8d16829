# strata-kernel: op=conv1d dialect=triton entry=launch dtypes=float32
"""conv1d (triton): torch's NCL conv1d with stride, zero padding, dilation and groups, + bias.

Grid (N·cdiv(Lo, BT), cdiv(CO, BO)): each program owns BT output positions of one image x BO
output channels and walks its group's C/G input channels, BC at a time, and the K taps (a
[BT, BC, BO] product summed over BC); taps outside [0, L) load as zeros, ragged tails
masked. S, P, D are read from geom inside the kernel. float32 arithmetic.
"""
import triton
import triton.language as tl


@triton.jit
def _conv_kernel(out_ptr, x_ptr, w_ptr, b_ptr, C, L, CO, Lo, blocks, geom_ptr, cg, og,
                 K: tl.constexpr, BT: tl.constexpr, BO: tl.constexpr, BC: tl.constexpr):
    S = tl.load(geom_ptr)  # stride, padding and dilation, read on the device
    P = tl.load(geom_ptr + 1)
    D = tl.load(geom_ptr + 2)
    n = (tl.program_id(0) // blocks).to(tl.int64)
    t = (tl.program_id(0) % blocks) * BT + tl.arange(0, BT)
    o = tl.program_id(1) * BO + tl.arange(0, BO)
    t_ok, o_ok = t < Lo, o < CO
    c0 = (o // og) * cg
    acc = tl.zeros((BT, BO), dtype=tl.float32) + \
        tl.load(b_ptr + o, mask=o_ok, other=0.0).to(tl.float32)[None, :]
    cc = tl.arange(0, BC)
    for cb in range(0, cg, BC):  # BC input channels at once: a [BT, BC, BO] product
        c_ok = (cb + cc) < cg
        row = (n * C + c0[None, :] + cb + cc[:, None]) * L  # [BC, BO]: each input row
        for k in range(0, K):
            s = t * S - P + k * D
            inside = t_ok & (s >= 0) & (s < L)
            xv = tl.load(x_ptr + row[None, :, :] + s[:, None, None],
                         mask=inside[:, None, None] & (c_ok[:, None] & o_ok[None, :])[None],
                         other=0.0)
            wv = tl.load(w_ptr + (o[None, :] * cg + cb + cc[:, None]) * K + k,
                         mask=c_ok[:, None] & o_ok[None, :], other=0.0)
            acc += tl.sum(xv.to(tl.float32) * wv.to(tl.float32)[None, :, :], axis=1)
    dst = (n * CO + o[None, :]) * Lo + t[:, None]
    tl.store(out_ptr + dst, acc.to(out_ptr.dtype.element_ty), mask=t_ok[:, None] & o_ok[None, :])


def launch(out, x, w, b, geom):
    N, C, L = x.shape
    CO, cg, K = w.shape
    Lo = out.shape[2]
    if N * Lo == 0 or CO == 0:
        return
    BT, BO = 32, min(64, triton.next_power_of_2(CO))
    BC = min(16, triton.next_power_of_2(cg))
    blocks = triton.cdiv(Lo, BT)
    _conv_kernel[(N * blocks, triton.cdiv(CO, BO))](
        out, x, w, b, C, L, CO, Lo, blocks, geom, cg, CO // (C // cg), K=K, BT=BT, BO=BO,
        BC=BC, num_warps=4)
