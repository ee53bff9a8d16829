# strata-kernel: op=attention_backward dialect=triton entry=launch dtypes=float32,bfloat16,float16
"""attention_backward (triton): causal GQA attention gradients from the saved o and lse,
flash-attention-2 style (probabilities recomputed per block, never a T x T matrix).

out = [dq (H*T*D) | dk (Hkv*T*D) | dv (Hkv*T*D)] (flat); dk/dv summed over the H/Hkv query
heads of each kv head. With p = exp(scale*q.k - lse) (causal), delta = rowsum(dout*o):
    dv = p^T dout,  ds = p * (dout v^T - delta),  dk = scale ds^T q,  dq = scale ds k.

Two kernels, no atomics, so the result is deterministic:
- dk/dv: grid (cdiv(T, BLOCK_N), Hkv). A program owns BLOCK_N keys of one kv head, keeps
  their k, v and float32 dk, dv accumulators in registers and walks every query head of its
  group and every query block at or after its keys (the causal region), in a fixed order.
- dq: grid (cdiv(T, BLOCK_M), H). A program owns BLOCK_M query rows and walks the key
  blocks up to its causal limit.
delta is recomputed per query block from o and dout (one extra read of o: the launcher may
not allocate a scratch buffer with torch compute). Probabilities go through exp2 with
scale*log2(e) and lse*log2(e). Masked lanes (ragged T, causal) get p = 0. The head dim is
padded to a power of two >= 16; float32 dots are exact (input_precision="ieee"), 16-bit
inputs use tensor cores with float32 accumulators.
"""
import triton
import triton.language as tl

LOG2E = 1.4426950408889634


@triton.jit
def _dkdv_kernel(out_ptr, q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, do_ptr, T, D, GROUP,
                 DK_OFF, DV_OFF, qk_scale, scale,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 PRECISION: tl.constexpr):
    start_n = tl.program_id(0) * BLOCK_N
    g = tl.program_id(1).to(tl.int64)
    offs_n = start_n + tl.arange(0, BLOCK_N)
    offs_m0 = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask_n = offs_n < T
    mask_d = offs_d < D
    kv_mask = mask_n[:, None] & mask_d[None, :]
    kv_off = g * T * D + offs_n[:, None] * D + offs_d[None, :]
    kb = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0)
    vb = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    first_m = (start_n // BLOCK_M) * BLOCK_M
    for j in range(0, GROUP):
        h = g * GROUP + j
        for start_m in range(first_m, T, BLOCK_M):
            offs_m = start_m + offs_m0
            mask_m = offs_m < T
            row_mask = mask_m[:, None] & mask_d[None, :]
            row_off = h * T * D + offs_m[:, None] * D + offs_d[None, :]
            qb = tl.load(q_ptr + row_off, mask=row_mask, other=0.0)
            dob = tl.load(do_ptr + row_off, mask=row_mask, other=0.0)
            ob = tl.load(o_ptr + row_off, mask=row_mask, other=0.0)
            delta = tl.sum(dob.to(tl.float32) * ob.to(tl.float32), axis=1)
            lse = tl.load(lse_ptr + h * T + offs_m, mask=mask_m, other=0.0).to(tl.float32)
            # transposed scores [BLOCK_N, BLOCK_M]: keys along rows
            st = tl.dot(kb, tl.trans(qb), input_precision=PRECISION)
            valid = (offs_m[None, :] >= offs_n[:, None]) & mask_m[None, :] & mask_n[:, None]
            pt = tl.where(valid, tl.exp2(st * qk_scale - lse[None, :] * 1.4426950408889634),
                          0.0)
            dv = tl.dot(pt.to(dob.dtype), dob, dv, input_precision=PRECISION)
            dpt = tl.dot(vb, tl.trans(dob), input_precision=PRECISION)
            dst = pt * (dpt - delta[None, :])
            dk = tl.dot(dst.to(qb.dtype), qb, dk, input_precision=PRECISION)
    dk = dk * scale
    tl.store(out_ptr + DK_OFF + kv_off, dk.to(out_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(out_ptr + DV_OFF + kv_off, dv.to(out_ptr.dtype.element_ty), mask=kv_mask)


@triton.jit
def _dq_kernel(out_ptr, q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, do_ptr, T, D, GROUP,
               qk_scale, scale,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
               PRECISION: tl.constexpr):
    start_m = tl.program_id(0) * BLOCK_M
    h = tl.program_id(1).to(tl.int64)
    g = h // GROUP
    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n0 = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    mask_m = offs_m < T
    mask_d = offs_d < D
    row_mask = mask_m[:, None] & mask_d[None, :]
    row_off = h * T * D + offs_m[:, None] * D + offs_d[None, :]
    qb = tl.load(q_ptr + row_off, mask=row_mask, other=0.0)
    dob = tl.load(do_ptr + row_off, mask=row_mask, other=0.0)
    ob = tl.load(o_ptr + row_off, mask=row_mask, other=0.0)
    delta = tl.sum(dob.to(tl.float32) * ob.to(tl.float32), axis=1)
    lse2 = tl.load(lse_ptr + h * T + offs_m, mask=mask_m, other=0.0).to(tl.float32) * \
        1.4426950408889634
    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    hi = tl.minimum(start_m + BLOCK_M, T)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + offs_n0
        mask_n = offs_n < T
        kv_mask = mask_n[:, None] & mask_d[None, :]
        kv_off = g * T * D + offs_n[:, None] * D + offs_d[None, :]
        kb = tl.load(k_ptr + kv_off, mask=kv_mask, other=0.0)
        vb = tl.load(v_ptr + kv_off, mask=kv_mask, other=0.0)
        s = tl.dot(qb, tl.trans(kb), input_precision=PRECISION)
        valid = (offs_n[None, :] <= offs_m[:, None]) & mask_n[None, :] & mask_m[:, None]
        p = tl.where(valid, tl.exp2(s * qk_scale - lse2[:, None]), 0.0)
        dp = tl.dot(dob, tl.trans(vb), input_precision=PRECISION)
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(kb.dtype), kb, dq, input_precision=PRECISION)
    dq = dq * scale
    tl.store(out_ptr + row_off, dq.to(out_ptr.dtype.element_ty), mask=row_mask)


def launch(out, q, k, v, o, lse, dout, scale=None):
    H, T, D = q.shape
    Hkv = k.shape[0]
    if H == 0 or T == 0 or D == 0:
        return
    if scale is None:
        scale = D ** -0.5
    fp32 = q.element_size() == 4
    BLOCK_D = max(16, triton.next_power_of_2(D))
    # float32 (exact dots, no tensor cores) keeps blocks small to stay within registers
    bm, bn, warps = (32, 32, 4) if fp32 or BLOCK_D > 64 else (64, 64, 4)
    tp = max(16, triton.next_power_of_2(T))
    BLOCK_M, BLOCK_N = min(bm, tp), min(bn, tp)
    common = dict(BLOCK_D=BLOCK_D, PRECISION="ieee" if fp32 else "tf32", num_warps=warps,
                  num_stages=2)
    qk_scale = float(scale) * LOG2E
    _dkdv_kernel[(triton.cdiv(T, BLOCK_N), Hkv)](
        out, q, k, v, o, lse, dout, T, D, H // Hkv, H * T * D, H * T * D + Hkv * T * D,
        qk_scale, float(scale), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **common)
    _dq_kernel[(triton.cdiv(T, BLOCK_M), H)](
        out, q, k, v, o, lse, dout, T, D, H // Hkv, qk_scale, float(scale),
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, **common)
