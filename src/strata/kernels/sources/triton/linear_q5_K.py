# strata-kernel: op=linear_q5_K dialect=triton entry=launch dtypes=float32
"""linear_q5_K (triton): x [B,K] float32 @ GGUF q5_K weight [N, K/256*176]^T with ggml's
numerics (docs/kernels-abi.md; ggml_vec_dot_q5_K_q8_K): linear_q4_K's program (its file
explains it) with each weight's fifth bit, bit j of qh[l] for weight l of sub-block j,
added as 16 (qh[32] sits before the 128 nibble bytes).

Grid (cdiv(N, BLOCK_N), B): a program owns BLOCK_N weight rows and one row of x and walks
the K/256 super-blocks. It quantises each 256 values of x to q8_K as ggml's
quantize_row_q8_K_ref: max = the first value of largest |x| (the lowest index among the
ties), iscale = -127/max (IEEE division), q_x = min(127, round_half_even(iscale*x)) with the
product rounded to float32 first (no contraction) and the rounding (v + 1.5*2^23) - 1.5*2^23,
d_x = 1/iscale; an all-zero block gives d_x = 0 and q_x = 0. Per super-block, as [8, 32]
(sub-block j, weight l): the nibble of qs[32*(j//2) + l] (low for even j, high for odd) plus
16 times bit j of qh[l], the
6-bit scale and min of sub-block j by get_scale_min_k4, then in int32
    sumi = sum_j sc_j * sum_l q_w*q_x      msum = sum_j m_j * sum_l q_x
and acc += f32(d_x*d) * sumi - f32(d_x*dmin) * msum in float32.
"""
import triton
import triton.language as tl


@triton.jit
def _q8k(x_row, s, offs):
    """q8_K of super-block s of an x row, as [8, 32] int32, and its d_x."""
    xv = tl.load(x_row + s * 256 + offs)
    ax = tl.abs(xv)
    amax = tl.max(tl.max(ax, axis=1), axis=0)
    first = tl.min(tl.min(tl.where(ax == amax, offs, 256), axis=1), axis=0)
    mx = tl.sum(tl.sum(tl.where(offs == first, xv, 0.0), axis=1), axis=0)
    nonzero = amax != 0.0
    iscale = tl.where(nonzero, tl.math.div_rn(-127.0, tl.where(nonzero, mx, 1.0)), 0.0)
    v = xv * iscale
    q = tl.minimum(((v + 12582912.0) - 12582912.0).to(tl.int32), 127)
    dx = tl.where(nonzero, tl.math.div_rn(1.0, tl.where(nonzero, iscale, 1.0)), 0.0)
    return q, dx


@triton.jit
def _linear_q5_K_kernel(out_ptr, x_ptr, w_ptr, N, K, NSB, ROW_BYTES,
                        BLOCK_N: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    b = tl.program_id(1).to(tl.int64)
    mask_n = offs_n < N
    row_base = w_ptr + offs_n.to(tl.int64) * ROW_BYTES
    x_row = x_ptr + b * K
    j = tl.arange(0, 8)
    lane = tl.arange(0, 32)
    offs = j[:, None] * 32 + lane[None, :]
    m3 = mask_n[:, None, None]
    low = j < 4
    acc = tl.zeros([BLOCK_N], tl.float32)
    for s in range(0, NSB):
        q, dx = _q8k(x_row, s, offs)
        sb = row_base + s * 176
        byte = tl.load(sb[:, None, None] + 48 + (j[:, None] // 2) * 32 + lane[None, :],
                       mask=m3, other=0).to(tl.int32)
        qh = tl.load(sb[:, None, None] + 16 + lane[None, None, :], mask=m3, other=0).to(tl.int32)
        nib = tl.where((j % 2 == 0)[None, :, None], byte & 15, byte >> 4) + \
            ((qh >> j[None, :, None]) & 1) * 16
        isum = tl.sum(nib * q[None, :, :], axis=2)  # [BLOCK_N, 8]
        mn = mask_n[:, None]
        a = tl.load(sb[:, None] + 4 + tl.where(low, j, j + 4)[None, :], mask=mn,
                    other=0).to(tl.int32)
        c = tl.load(sb[:, None] + 4 + tl.where(low, j + 4, j - 4)[None, :], mask=mn,
                    other=0).to(tl.int32)
        e = tl.load(sb[:, None] + 4 + j[None, :], mask=mn, other=0).to(tl.int32)
        sc = tl.where(low[None, :], a & 63, (a & 15) | ((c >> 6) << 4))
        mins = tl.where(low[None, :], c & 63, (a >> 4) | ((e >> 6) << 4))
        sumi = tl.sum(sc * isum, axis=1)
        msum = tl.sum(mins * tl.sum(q, axis=1)[None, :], axis=1)
        h0 = tl.load(sb, mask=mask_n, other=0).to(tl.uint16)
        h1 = tl.load(sb + 1, mask=mask_n, other=0).to(tl.uint16)
        h2 = tl.load(sb + 2, mask=mask_n, other=0).to(tl.uint16)
        h3 = tl.load(sb + 3, mask=mask_n, other=0).to(tl.uint16)
        d = (h0 | (h1 << 8)).to(tl.float16, bitcast=True).to(tl.float32)
        dmin = (h2 | (h3 << 8)).to(tl.float16, bitcast=True).to(tl.float32)
        acc += (dx * d) * sumi.to(tl.float32) - (dx * dmin) * msum.to(tl.float32)
    tl.store(out_ptr + b * N + offs_n, acc, mask=mask_n)


def launch(out, x, w):
    B, K = x.shape
    N = w.shape[0]
    if B == 0 or N == 0:
        return
    BLOCK_N = 16
    grid = (triton.cdiv(N, BLOCK_N), B)
    _linear_q5_K_kernel[grid](out, x, w, N, K, K // 256, w.shape[1], BLOCK_N=BLOCK_N,
                              num_warps=4, enable_fp_fusion=False)
