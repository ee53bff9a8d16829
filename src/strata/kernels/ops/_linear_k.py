"""Shared spec builder for the K-quant linear layers with ggml's numerics (q4_K, q5_K, q6_K).

`linear_<kind>(x, w)`: x float32 `[B,K]` (K a multiple of 256), w the GGUF super-blocks as
stored (uint8 `[N, K/256·bytes]`, layouts in _kquant.py), out float32 `[B,N]`. What
llama.cpp's CPU backend computes (ggml_vec_dot_<kind>_q8_K): every 256 values of a row of x
are quantised to q8_K (_kquant.quantize_q8_k: float d, int8 q, int16 bsums of 16), then per
super-block

    q4_K / q5_K:  f32(d_x·d) · Σ_j sc_j·Σ_v q_v·q_x,v
                  - f32(d_x·dmin) · Σ_j m_j·(bsum_2j + bsum_2j+1)
    q6_K:         f32(d_x·d) · Σ_j sc_j·Σ_v (q_v - 32)·q_x,v

(integer sums exact; the min term through the activations' bsums, never through float x),
summed over the K/256 super-blocks. The reference does the same in float64 (exact but for
the last rounding), so a correct kernel differs from it only by its float32 summation order;
the vendor path (`eager`) is the same arithmetic in float32.
"""

from __future__ import annotations

from typing import Any

from strata.kernels.ops import _kquant, _kquant_x8
from strata.kernels.ops._shapes import lab_rows, model_dims, smallest_model, unique
from strata.kernels.spec import Clause, KernelSpec, Tolerance, dims_of, floats, generator, register

QK_K = _kquant.QK_K
PREFILL_ROWS = 64
X_SCALE = 8.0  # outputs well above 1 (checks.allowed_error scales atol by max(1, RMS))

# Why this tolerance: the integer sums are exact and d_x·d is rounded once to float32 exactly
# as ggml rounds it, so a correct kernel's only freedom is the float32 rounding of the terms
# and of their sum over K/256 super-blocks: a few 1e-7 of the output's RMS. The modelling
# errors to catch are larger by orders: float32 x instead of q8_K (~0.5% of the RMS), q8_0
# activations (32-blocks, fp16 d) instead of q8_K (~1e-3), the min term from float x instead
# of bsums (~1e-3), a mis-unpacked 6-bit scale or min (whole sub-blocks wrong).
TOLERANCE = Tolerance(1e-5, 1e-5)


def plant_x(x: Any, seed: int) -> Any:
    """x [B, K] with, in every row, one super-block of exact ties (max = ±127·2^e so
    iscale = ∓2^-e and iscale·x = k + 0.5 exactly: round-half-even differs from
    half-away) and, in rows b % 3 == 1, one all-zero super-block (d = 0)."""
    import torch

    g = generator(seed * 104729 + 29)
    B, K = x.shape
    nsb = K // QK_K
    for b in range(B):
        sb = int(torch.randint(0, nsb, (1,), generator=g))
        e = int(torch.randint(-5, 4, (1,), generator=g))
        vals = torch.randint(-126, 126, (QK_K,), generator=g).to(torch.float32)
        vals += 0.5 * (torch.rand(QK_K, generator=g) < 0.6).to(torch.float32)
        vals[int(torch.randint(0, QK_K, (1,), generator=g))] = 127.0 if b % 2 else -127.0
        x[b, sb * QK_K:(sb + 1) * QK_K] = vals * 2.0 ** e
        if b % 3 == 1 and nsb > 1:
            zero = (sb + 1) % nsb
            x[b, zero * QK_K:(zero + 1) * QK_K] = 0.0
    return x


def _ties(inputs: list[Any], shape: dict[str, int], seed: int) -> None:
    """Every super-block of x made of exact ties (as plant_x's tie block)."""
    import torch

    x = inputs[0]
    b, nsb = x.shape[0], x.shape[1] // QK_K
    g = generator(seed * 7 + 5)
    e = torch.randint(-5, 4, (b, nsb, 1), generator=g).to(torch.float32)
    vals = torch.randint(-126, 126, (b, nsb, QK_K), generator=g).to(torch.float32)
    vals += 0.5 * (torch.rand(b, nsb, QK_K, generator=g) < 0.6).to(torch.float32)
    top = torch.randint(0, QK_K, (b, nsb, 1), generator=g)
    vals.scatter_(2, top, torch.where(torch.rand(b, nsb, 1, generator=g) < 0.5, -127.0, 127.0))
    x.copy_((vals * 2.0 ** e).reshape(x.shape).to(x.dtype))


def _scale_bits(kind: str) -> Any:
    """Weights whose every packed scale/min (q4_K/q5_K) has its two high bits set in a
    pattern that differs per sub-block index, or q6_K scales at the int8 extremes: a kernel
    that mis-unpacks any sub-block's scale is wrong by whole sub-blocks."""

    def apply(inputs: list[Any], shape: dict[str, int], seed: int) -> None:
        import torch

        w = inputs[1]
        n, nsb = w.shape[0], w.shape[1] // _kquant.BLOCK_BYTES[kind]
        blocks = w.view(n, nsb, _kquant.BLOCK_BYTES[kind])
        g = generator(seed * 13 + 1)
        if kind == "q6_K":
            pick = torch.tensor([-128, 127, -1, 1, 64, -64, 0, 100], dtype=torch.int8)
            idx = torch.randint(0, len(pick), (n, nsb, 16), generator=g)
            blocks[:, :, 192:208] = pick[idx].view(torch.uint8).to(w.device)
            return
        # bytes 0..7 carry the high bits of sub-blocks 4..7; random low bits everywhere
        raw = torch.randint(0, 256, (n, nsb, 12), generator=g, dtype=torch.uint8)
        raw[:, :, 0:8] |= 0xC0 * (torch.arange(8) % 2 == 0).to(torch.uint8)
        blocks[:, :, 4:16] = raw.to(w.device)

    return apply


def _special_d(kind: str) -> Any:
    """Rows n % 3 == 0: every d (and dmin) an fp16 subnormal; n % 3 == 1: ±0."""

    def apply(inputs: list[Any], shape: dict[str, int], seed: int) -> None:
        import torch

        w = inputs[1]
        n, nsb = w.shape[0], w.shape[1] // _kquant.BLOCK_BYTES[kind]
        blocks = w.view(n, nsb, _kquant.BLOCK_BYTES[kind])
        g = generator(seed * 31 + 7)
        at = (208,) if kind == "q6_K" else (0, 2)
        for off in at:
            mant = torch.randint(1, 1024, (n, nsb), generator=g).to(torch.float64)
            sign = torch.where(torch.rand(n, nsb, generator=g) < 0.5, -1.0, 1.0)
            sub = (mant * 2.0 ** -24 * sign).to(torch.float16)
            zero = torch.zeros(n, nsb, dtype=torch.float16)
            zero[:, 1::2] = -0.0
            rows = torch.arange(n)[:, None]
            d = torch.where(rows % 3 == 0, sub, zero)
            keep = (torch.arange(n) % 3 == 2)[:, None, None].to(w.device)
            new = d.contiguous().view(torch.uint8).view(n, nsb, 2).to(w.device)
            blocks[:, :, off:off + 2] = torch.where(keep, blocks[:, :, off:off + 2], new)

    return apply


def _in_file_layout(kind: str, apply: Any) -> Any:
    """A clause on the file's layout applied to x8-packed weights (unpack, plant, repack)."""

    def planted(inputs: list[Any], shape: dict[str, int], seed: int) -> None:
        w = inputs[1]
        file_rows = _kquant_x8.unpack(kind, w, shape["K"])
        apply([inputs[0], file_rows, *inputs[2:]], shape, seed)
        w.copy_(_kquant_x8.pack(kind, file_rows, shape["K"]))

    return planted


def _clauses(kind: str, x8: bool) -> tuple[Clause, ...]:
    shape = {"B": 3, "N": 9, "K": 512}
    wrap = (lambda f: _in_file_layout(kind, f)) if x8 else (lambda f: f)
    return (
        Clause("ties", "q_x = round_half_even(iscale·x) with iscale = -127/max (float32): "
               "exact halves round to even, not away from zero.", shape, _ties),
        Clause("scale_bits", "Every sub-block's scale (and min) is unpacked from its packed "
               "bits, the high bits of sub-blocks 4..7 included (q6_K: int8 scales, -128 "
               "too).", {"B": 2, "N": 12, "K": 512}, wrap(_scale_bits(kind))),
        Clause("special_d", "A super-block's fp16 d (and dmin) may be a subnormal or ±0: "
               "decoded as such, no flush, no NaN.", {"B": 2, "N": 12, "K": 256},
               wrap(_special_d(kind))),
    )


def serve_shapes() -> list[dict[str, int]]:
    """-B lab's row range (a decode row through the smallest model's FFN width, a full
    prefill chunk through two super-blocks): the rows are the point; wider K would only slow
    the float64 oracle (the llm benchmarks reach it)."""
    decode, chunk = lab_rows()
    m = smallest_model()
    k = m.ffn - m.ffn % QK_K or QK_K
    return [{"B": decode, "N": m.hidden, "K": k}, {"B": chunk, "N": m.hidden, "K": 2 * QK_K}]


def _spec(kind: str, x8: bool) -> KernelSpec:
    block = _kquant.BLOCK_BYTES[kind]

    def as_stored(w: Any, k: int) -> Any:  # the file's layout, whatever the op's
        return _kquant_x8.unpack(kind, w, k) if x8 else w

    def inputs(s: dict[str, int], dtype: str, seed: int, device: str) -> list[Any]:
        x = plant_x(floats((s["B"], s["K"]), "float32", seed, "cpu", scale=X_SCALE), seed)
        w = _kquant.random_blocks(kind, s["N"], s["K"], seed)
        if x8:
            w = _kquant_x8.pack(kind, w, s["K"])
        return [x.to(device).contiguous(), w.to(device)]

    def reference(x: Any, w: Any) -> Any:
        return _kquant.linear(kind, x, as_stored(w, x.shape[1]))

    def eager(x: Any, w: Any) -> Any:
        import torch

        return _kquant.linear(kind, x, as_stored(w, x.shape[1]), acc=torch.float32)

    def weight_bytes(s: dict[str, int]) -> int:
        return s["N"] * s["K"] // QK_K * block

    dims = [(d.hidden, d.ffn) for d in model_dims()]
    llm = unique([{"B": b, "N": n, "K": k}
                  for hid, ffn in dims for b in (1, PREFILL_ROWS)
                  for n, k in ((hid, hid), (ffn, hid), (hid, ffn)) if k % QK_K == 0])
    layout = " (weights in strata's x8 layout: _kquant_x8.py)" if x8 else ""
    return KernelSpec(
        name=f"linear_{kind}{'x8' if x8 else ''}",
        summary=f"x @ {kind} weight^T with ggml's numerics (x quantised to q8_K, integer "
                f"dots){layout}",
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
        clauses=_clauses(kind, x8),
        shapes={
            "verify": [{"B": 1, "N": 1, "K": 256}, {"B": 1, "N": 7, "K": 512},
                       {"B": 3, "N": 40, "K": 256}, {"B": 2, "N": 33, "K": 768},
                       {"B": 5, "N": 19, "K": 1024}, {"B": 9, "N": 70, "K": 512}],
            "llm": llm,
            "figure": [{"B": 1, "N": 4096, "K": 4096}, {"B": PREFILL_ROWS, "N": 4096, "K": 4096}],
            "serve": serve_shapes(),
        },
        tolerances={"float32": TOLERANCE},
    )


def register_linear_k(kind: str, x8: bool = False) -> KernelSpec:
    """linear_<kind> on the file's layout, or linear_<kind>x8 on the x8 layout (the same
    arithmetic; only where the bytes sit differs)."""
    return register(_spec(kind, x8))
