"""Shared spec builder for the quantised linear layers with ggml's numerics (q8_0, q4_0, q5_0;
q4_1, q5_1).

`linear_<kind>(x, w)`: x float32 `[B,K]`, w the GGUF blocks as stored (uint8 `[N, K/32*bytes]`),
out float32 `[B,N]`. Unlike `matvec_<kind>` (fp32 activations against dequantised weights),
this is what llama.cpp's CPU backend computes: every 32-block of a row of x is first quantised
to q8_0 exactly as ggml's AVX2 `quantize_row_q8_0` does, then the dot is an integer one per
block, scaled by the product of the two fp16 scales:

    amax  = max |x_j| over the block                      (float32, exact)
    d_x   = fp16(amax / 127)                              (f32 division, then round-to-nearest-
                                                           even to binary16: the stored scale)
    id    = 127 / amax if amax != 0 else 0                (float32 division; NOT 1/d_x)
    q_x   = round_half_even(x_j * id)                     (float32 product; int8 in [-127,127])
    isum  = sum_j q_w[j] * q_x[j]                         (integer, exact)
    out   = sum_blocks f32(d_w) * f32(d_x) * isum

with q_w the int8 weights (q8_0), nibble-8 (q4_0) or nibble+16*bit-16 (q5_0). MXFP4
(`vec_dot_mxfp4_q8_0`, linear_mxfp4.py) is the same with q_w = MXFP4_VALUES[nibble] (e2m1
doubled: 0, ±1, ±2, ±3, ±4, ±6, ±8, ±12) and d_w = 2^(e-128) from the block's exponent byte.
The reference
quantises x in float32 the same way and sums in float64 (exact up to the final rounding), so a
correct kernel differs from it only by its float32 summation order. The vendor path (`eager`,
also dispatch's fallback) is the same computation with a float32 matmul over the dequantised
values: faster, and off by float32 rounding over K terms (~1e-5 of the RMS at K = 4096), not
over K/32 blocks. `make_inputs` plants blocks that exercise the rules the random data would
almost never reach: exact ties x*id = k+0.5 (round-half-even vs round-half-away), an all-zero
block (id = 0) and an fp16-subnormal scale.

q4_1 / q5_1 (value d_w*q + m_w, q the unsigned nibble or nibble+16*bit) dot against q8_1
(`vec_dot_q4_1_q8_1`): x quantised as above plus s_x = fp16(f32(amax/127) * sum_j q_x[j]) per
block (ggml's AVX2 quantize_row_q8_1: the float32 d, not its fp16 rounding), and

    out   = sum_blocks f32(d_w) * f32(d_x) * isum + f32(m_w) * f32(s_x)
"""

from __future__ import annotations

from typing import Any

from strata.kernels.ops import _quant
from strata.kernels.ops._clauses import special_scales
from strata.kernels.ops._linear_f import serve_shapes
from strata.kernels.ops._shapes import ffn_sizes, hidden_sizes, model_dims, unique
from strata.kernels.spec import Clause, KernelSpec, Tolerance, dims_of, floats, generator, register

QK = _quant.QK
PREFILL_ROWS = 64  # a prefill chunk of prompt tokens through the same op
# x is drawn at this scale so outputs are well above 1 (checks.allowed_error scales atol by
# max(1, RMS): outputs below 1 would turn the relative bound into a loose absolute one)
X_SCALE = 8.0

# Why this tolerance (float32; the only dtype of the op): the integer part is exact, the
# scales are products of two fp16 values (exact in float32; mxfp4's 2^(e-128)·d_x too but
# below float32's normal range, where a block adds ~1e-35 to outputs well above 1), so the
# only freedom a correct kernel has is the float32 rounding of d*isum per block and of the
# sum over the K/32 blocks:
# a relative error of a few 1e-7 of the output's RMS. The smallest *modelling* error we must
# catch is far larger: skipping the activation quantisation (fp32 x) is off by ~0.5% of the
# RMS, keeping d_x in float32 instead of fp16 by ~1e-4 at small K, rounding half away from
# zero by ~1e-3 on the planted tie blocks, one q_x off by one by > 1e-4 (K <= 4096). The
# bound below (1e-5 * max(1, RMS) + 1e-5 * |ref|, checks.allowed_error) sits between the two.
TOLERANCE = Tolerance(1e-5, 1e-5)


def quantize_rows(x: Any) -> tuple[Any, Any]:
    """ggml's AVX2 q8_0 quantisation of the rows of x [B, K] (float32 arithmetic whatever
    x's dtype): (q int8-valued float32 [B, K/32, 32], d float32 [B, K/32] = the fp16 scale)."""
    import torch

    x = x.to(torch.float32)
    blocks = x.reshape(x.shape[0], -1, QK)
    amax = blocks.abs().amax(dim=-1)
    # Both quotients are float32 divisions, correctly rounded: torch divides a scalar by a
    # tensor as a product with the reciprocal (one ulp off in a quarter of blocks, enough to
    # move a q_x across a rounding boundary now and then), so each is taken in float64 and
    # rounded once to float32 (exact: 53 bits >= 2*24 + 2).
    a64 = amax.to(torch.float64)
    d = (a64 / 127.0).to(torch.float32).to(torch.float16).to(torch.float32)
    nonzero = amax != 0
    inv = torch.where(nonzero, 127.0 / torch.where(nonzero, a64, torch.ones_like(a64)),
                      torch.zeros_like(a64)).to(torch.float32)
    q = torch.round(blocks * inv.unsqueeze(-1))  # torch.round: half to even
    return q, d


def q8_0_blocks(x: Any) -> Any:
    """The GGUF q8_0 blocks of x [..., K] (K a multiple of 32) as ggml's quantize_row_q8_0
    writes them (quantize_rows): uint8 [..., K/32*34], each block its fp16 scale then 32
    int8. NaN or infinite values give a NaN or infinite scale (the block decodes to NaN or
    ±inf, never to finite values)."""
    import torch

    lead, k = x.shape[:-1], x.shape[-1]
    q, d = quantize_rows(x.reshape(-1, k))
    q = torch.nan_to_num(q, nan=0.0, posinf=0.0, neginf=0.0).clamp(-127, 127)
    scale = d.to(torch.float16).view(torch.uint8).reshape(q.shape[0], -1, 2)
    body = q.to(torch.int8).view(torch.uint8)
    return torch.cat([scale, body], dim=-1).reshape(*lead, k // QK * _quant.BLOCK_BYTES["q8_0"])


def q8_1_sums(x: Any, qx: Any) -> Any:
    """ggml's AVX2 quantize_row_q8_1 adds s = fp16(d·Σq) per block, with d = amax/127 in
    float32 (not its fp16 rounding): float32 [B, K/32]. q4_1/q5_1's min term reads it."""
    import torch

    amax = x.to(torch.float32).reshape(x.shape[0], -1, QK).abs().amax(dim=-1)
    d32 = (amax.to(torch.float64) / 127.0).to(torch.float32)
    return (d32 * qx.sum(-1)).to(torch.float16).to(torch.float32)  # float32 product, then fp16


def _weights(kind: str, w: Any, k: int) -> tuple[Any, Any]:
    """(q float32 [N, K/32, 32] integer-valued, d float32 [N, K/32]) of the GGUF blocks."""
    return _quant.decode(kind, w, k)


def linear(kind: str, x: Any, w: Any, acc: Any = None, chunk_rows: int = 2048) -> Any:
    """out[b, n] = sum_blocks d_w*d_x*isum with x quantised the ggml way; products and sums
    in `acc` (float64 for the oracle: exact but for the last rounding; float32 for the vendor
    path). Float32 result, on x's device; the weights are processed `chunk_rows` at a time."""
    import torch

    acc = acc or torch.float64
    B, K = x.shape
    qx, dx = quantize_rows(x)
    ax = (qx * dx.unsqueeze(-1)).to(acc).reshape(B, K)  # d_x*q_x: exact in float32 already
    sx = q8_1_sums(x, qx).to(acc) if kind in _quant.MIN_KINDS else None
    out = torch.empty(B, w.shape[0], dtype=torch.float32, device=x.device)
    for n0 in range(0, w.shape[0], chunk_rows):
        rows = w[n0:n0 + chunk_rows].to(x.device)
        qw, dw = _weights(kind, rows, K)
        aw = (qw * dw.unsqueeze(-1)).to(acc).reshape(qw.shape[0], K)  # exact (8+11 bits)
        y = ax @ aw.T
        if sx is not None:  # q4_1/q5_1: + Σ_blocks m_w·s_x (fp16·fp16: exact in float32)
            y = y + sx @ _quant.minimum(kind, rows, K).to(acc).T
        out[:, n0:n0 + chunk_rows] = y.to(torch.float32)
    return out


def plant_blocks(x: Any, seed: int) -> Any:
    """x [B, K] float32 with a few blocks replaced (in place, returned): in every row one
    block of exact ties (values (k+0.5)*2^e and k*2^e with amax = 127*2^e, so id = 2^-e and
    x*id = k+0.5 exactly: round-half-even and round-half-away differ), and in rows b % 3 == 1
    one all-zero block (amax = 0: d = id = 0) and one block of tiny values (d_x an fp16
    subnormal)."""
    import torch

    g = torch.Generator().manual_seed(seed * 104729 + 17)
    B, K = x.shape
    nb = K // QK
    for b in range(B):
        blk = int(torch.randint(0, nb, (1,), generator=g))
        e = int(torch.randint(-5, 4, (1,), generator=g))
        k = torch.randint(-126, 126, (QK,), generator=g).to(torch.float32)
        half = torch.rand(QK, generator=g) < 0.6
        vals = k + 0.5 * half.to(torch.float32)
        vals[int(torch.randint(0, QK, (1,), generator=g))] = 127.0 * (1 if b % 2 else -1)
        x[b, blk * QK:(blk + 1) * QK] = vals * 2.0 ** e
        if b % 3 == 1 and nb > 1:
            zero = (blk + 1 + int(torch.randint(0, nb - 1, (1,), generator=g))) % nb
            x[b, zero * QK:(zero + 1) * QK] = 0.0
            if nb > 2:
                tiny = next(i for i in range(nb) if i not in (blk, zero))
                x[b, tiny * QK:(tiny + 1) * QK] *= 1e-4 / float(x[b, tiny * QK:(tiny + 1) * QK]
                                                                .abs().max().clamp_min(1e-30))
    return x


def _ties(inputs, shape, seed):
    """Every block of x made of exact ties, as plant_blocks' tie block: values (k + 0.5)·2^e
    and k·2^e with one ±127·2^e (amax), so id = 2^-e and x·id = k + 0.5 exactly."""
    import torch

    x = inputs[0]
    b, nb = x.shape[0], x.shape[1] // QK
    g = generator(seed * 7 + 3)
    e = torch.randint(-5, 4, (b, nb, 1), generator=g).to(torch.float32)
    vals = torch.randint(-126, 126, (b, nb, QK), generator=g).to(torch.float32)
    vals += 0.5 * (torch.rand(b, nb, QK, generator=g) < 0.6).to(torch.float32)
    top = torch.randint(0, QK, (b, nb, 1), generator=g)
    sign = torch.where(torch.rand(b, nb, 1, generator=g) < 0.5, -127.0, 127.0)
    vals.scatter_(2, top, sign)
    x.copy_((vals * 2.0 ** e).reshape(x.shape).to(x.dtype))


def _zero_blocks(inputs, shape, seed):
    """Blocks 0, 2, 4, ... of every row of x all zeros."""
    x = inputs[0]
    x.view(x.shape[0], -1, QK)[:, 0::2] = 0.0


def _tiny_rows(inputs, shape, seed):
    """Every row of x scaled to amax 4e-3: amax/127 ~ 3e-5, an fp16 subnormal (< 6.1e-5)."""
    x = inputs[0]
    x.mul_(4e-3 / x.abs().amax(dim=1, keepdim=True).clamp_min(1e-30))


def _clauses(kind: str, weight_clauses: tuple[Clause, ...] | None) -> tuple[Clause, ...]:
    """The activation clauses every kind shares, then the weights' own (by default: the fp16
    block scales' special values)."""
    shape = {"B": 3, "N": 9, "K": 128}
    if weight_clauses is None:
        weight_clauses = (special_scales(kind, 1, {"B": 3, "N": 12, "K": 128},
                                         name="weight_scales"),)
    return (
        Clause("ties", "x·id exactly halfway between two integers rounds half to even "
               "(q_x = round_half_even(x·id)), not away from zero.", shape, _ties),
        Clause("zero_block", "An all-zero block of x (amax 0) gets d_x = 0 and id = 0 and "
               "contributes 0 (no 0/0, no NaN).", shape, _zero_blocks),
        Clause("subnormal_dx", "A block of x whose amax/127 lies below fp16's normal range "
               "keeps its fp16 subnormal d_x (no flush to zero).", shape, _tiny_rows),
        *weight_clauses,
    )


def _spec(kind: str, weight_clauses: tuple[Clause, ...] | None = None) -> KernelSpec:
    block = _quant.BLOCK_BYTES[kind]

    def inputs(s, dtype, seed, device):
        x = plant_blocks(floats((s["B"], s["K"]), "float32", seed, "cpu", scale=X_SCALE), seed)
        w = _quant.random_blocks(kind, s["N"], s["K"], seed)
        return [x.to(dtype=_dtype(dtype), device=device).contiguous(), w.to(device)]

    def reference(x, w):
        return linear(kind, x, w)

    def eager(x, w):
        import torch

        return linear(kind, x, w, acc=torch.float32)

    def weight_bytes(s):
        return s["N"] * s["K"] // QK * block

    h, f = hidden_sizes(), ffn_sizes()
    dims = [(d.hidden, d.ffn) for d in model_dims()]
    llm = unique([{"B": b, "N": n, "K": k}
                  for hid, ffn in dims for b in (1, PREFILL_ROWS)
                  for n, k in ((hid, hid), (ffn, hid))]
                 + [{"B": 1, "N": hid, "K": ffn} for hid, ffn in dims])
    assert all(k % QK == 0 for k in h + f)
    return KernelSpec(
        name=f"linear_{kind}",
        summary=f"x @ {kind} weight^T with ggml's numerics (x quantised to "
                f"{'q8_1' if kind in _quant.MIN_KINDS else 'q8_0'}, integer dots)",
        inputs=("x", "w"),
        make_inputs=inputs,
        out_shape=lambda s: (s["B"], s["N"]),
        out_dtype="float32",
        reference=reference,
        eager=eager,
        flops=lambda s: 2.0 * s["B"] * s["N"] * s["K"],
        bytes=lambda s, e: float(weight_bytes(s) + 4 * s["B"] * (s["K"] + s["N"])),
        sizes=lambda o, x, w: (x.shape[0], w.shape[0], x.shape[1]),
        dims=dims_of(B=(1, 0), N=(2, 0), K=(1, 1)),
        clauses=_clauses(kind, weight_clauses),
        shapes={
            "verify": [{"B": 1, "N": 1, "K": 32}, {"B": 1, "N": 7, "K": 96},
                       {"B": 3, "N": 40, "K": 64}, {"B": 2, "N": 33, "K": 256},
                       {"B": 5, "N": 19, "K": 1024}, {"B": 9, "N": 70, "K": 160}],
            "llm": llm,
            "figure": [{"B": 1, "N": 4096, "K": 4096}, {"B": PREFILL_ROWS, "N": 4096, "K": 4096}],
            "serve": serve_shapes(),
        },
        tolerances={"float32": TOLERANCE},
    )


def _dtype(name: str) -> Any:
    import torch

    return getattr(torch, name)


def register_linear(kind: str, weight_clauses: tuple[Clause, ...] | None = None) -> KernelSpec:
    """Register linear_<kind>; `weight_clauses` replace the fp16-scale clause for a kind whose
    blocks carry no fp16 scale (mxfp4)."""
    return register(_spec(kind, weight_clauses))
