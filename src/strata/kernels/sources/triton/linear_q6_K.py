# strata-kernel: op=linear_q6_K dialect=triton entry=launch dtypes=float32
"""linear_q6_K (triton): x [B,K] float32 @ GGUF q6_K weight [N, K/256*210]^T with ggml's
numerics (docs/kernels-abi.md; ggml_vec_dot_q6_K_q8_K).

Grid (cdiv(N, BLOCK_N), B): a program owns BLOCK_N weight rows and one row of x and walks
the K/256 super-blocks; x is quantised to q8_K as in linear_q4_K's triton program (the
first value of largest |x|, iscale = -127/max, round half to even, d_x = 1/iscale). A
super-block (ql[128], qh[64], int8 scales[16], fp16 d) as [8, 32] (group g = 4h + i, l):
weight 128h + 32i + l has the low 4 bits (ql[64h + 32*(i & 1) + l] >> 4*(i >> 1)) & 15 and
the high 2 bits (qh[32h + l] >> 2i) & 3, offset -32, and scale scales[8h + 2i + l//16];
sumi = sum sc * (q - 32) * q_x in int32 (exact), acc += f32(d_x*d) * sumi in float32.
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
def _linear_q6_K_kernel(out_ptr, x_ptr, w_ptr, N, K, NSB, ROW_BYTES,
                        BLOCK_N: tl.constexpr):
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    b = tl.program_id(1).to(tl.int64)
    mask_n = offs_n < N
    row_base = w_ptr + offs_n.to(tl.int64) * ROW_BYTES
    x_row = x_ptr + b * K
    g = tl.arange(0, 8)
    lane = tl.arange(0, 32)
    offs = g[:, None] * 32 + lane[None, :]
    h, i = g // 4, g % 4
    m3 = mask_n[:, None, None]
    ql_at = (64 * h + 32 * (i & 1))[:, None] + lane[None, :]  # [8, 32]
    qh_at = 128 + (32 * h)[:, None] + lane[None, :]
    sc_at = 192 + (8 * h + 2 * i)[:, None] + lane[None, :] // 16
    acc = tl.zeros([BLOCK_N], tl.float32)
    for s in range(0, NSB):
        q, dx = _q8k(x_row, s, offs)
        sb = row_base + s * 210
        ql = tl.load(sb[:, None, None] + ql_at[None, :, :], mask=m3, other=0).to(tl.int32)
        qh = tl.load(sb[:, None, None] + qh_at[None, :, :], mask=m3, other=0).to(tl.int32)
        sc = tl.load(sb[:, None, None] + sc_at[None, :, :], mask=m3,
                     other=0).to(tl.int8, bitcast=True).to(tl.int32)
        w = ((ql >> (4 * (i >> 1))[None, :, None]) & 15) | \
            (((qh >> (2 * i)[None, :, None]) & 3) << 4)
        sumi = tl.sum(tl.sum(sc * (w - 32) * q[None, :, :], axis=2), axis=1)
        h0 = tl.load(sb + 208, mask=mask_n, other=0).to(tl.uint16)
        h1 = tl.load(sb + 209, mask=mask_n, other=0).to(tl.uint16)
        d = (h0 | (h1 << 8)).to(tl.float16, bitcast=True).to(tl.float32)
        acc += (dx * d) * sumi.to(tl.float32)
    tl.store(out_ptr + b * N + offs_n, acc, mask=mask_n)


def launch(out, x, w):
    B, K = x.shape
    N = w.shape[0]
    if B == 0 or N == 0:
        return
    BLOCK_N = 16
    grid = (triton.cdiv(N, BLOCK_N), B)
    _linear_q6_K_kernel[grid](out, x, w, N, K, K // 256, w.shape[1], BLOCK_N=BLOCK_N,
                              num_warps=4, enable_fp_fusion=False)
