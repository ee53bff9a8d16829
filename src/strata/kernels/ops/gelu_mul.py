"""gelu_mul: gelu(a) * b, the GeGLU gate of Gemma's MLP, with ggml's CPU GELU.

GELU is the tanh form, 0.5·x·(1 + tanh(√(2/π)·x·(1 + 0.044715·x²))), evaluated as llama.cpp's
CPU backend does (ggml-cpu/vec.h, GGML_GELU_FP16, on by default): a ≤ -10 gives 0, a ≥ 10
gives a; otherwise a is rounded to fp16, its GELU computed in float32 and rounded to fp16 (a
65 536-entry table there), then multiplied by b in float32. The lab reproduces ggml's numerics
so `-B lab` matches llama.cpp's logits; a kernel evaluating the unrounded formula is off by up
to one fp16 step of the GELU (2⁻¹¹ relative), which the tolerance admits only for rounding
ties: rtol 1e-3.

Below a ≈ -4.5 the GELU is an fp16 subnormal (steps of 2⁻²⁴, a large part of the value), and
1 + tanh(u) is a float32 cancellation near -1 whose result is a multiple of tanh's ulp: any
float32 evaluation (ggml's tanhf, torch's, a vectorised exp) lands a few such quanta apart,
each 2⁻²⁴·|x| after the ½x. The slack admits that, times |b|: (1 + |x|)·2⁻²³·|b| per
element (x = a clamped to ±10) — 6.6e-7·|b| at a = -4.5, where the GELU is 5.1e-6: a kernel
that drops the tail from there on is still wrong; beyond a ≈ -5 (GELU 2.3e-7) the tail is
below float32's own resolution of 1 + tanh and no check can see it. Heavy-tailed b (|b| up
to ~250) made the fixed atol fail a correct kernel now and then.
"""

import math

from strata.kernels.ops._clauses import ragged, saturate
from strata.kernels.ops.silu_mul import SHAPES, gate_inputs
from strata.kernels.spec import Clause, KernelSpec, Tolerance, dims_of, register

CLAUSES = (
    Clause("saturation", "A large |a| (±89 to ±1e4) saturates: gelu(a)·b is a·b for a ≥ 10 "
           "and 0 for a ≤ -10, never NaN.", {"rows": 4, "cols": 33}, saturate),
    ragged({"rows": 3, "cols": 7}, "n = rows·cols"),
)


def ggml_gelu(a):
    """ggml's CPU GELU of a float tensor (see the module docstring)."""
    import torch

    x = a.float().clamp(-10.0, 10.0).half().float()  # the table's fp16 input
    g = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * x * (1.0 + 0.044715 * x * x)))
    g = g.half().float()
    a = a.float()
    return torch.where(a <= -10.0, torch.zeros_like(a), torch.where(a >= 10.0, a, g))


def _reference(a, b):
    return (ggml_gelu(a) * b.float()).to(a.dtype)


def _slack(a, b):
    """The float32 evaluations' spread of the subnormal GELU, times |b| (module docstring)."""
    x = a.float().clamp(-10.0, 10.0).abs()
    return (1.0 + x) * 2.0 ** -23 * b.float().abs()


SPEC = register(KernelSpec(
    name="gelu_mul",
    summary="gelu(a) * b (GeGLU gate, ggml's fp16-rounded tanh GELU)",
    inputs=("a", "b"),
    make_inputs=gate_inputs,
    out_shape=lambda s: (s["rows"], s["cols"]),
    reference=_reference,
    flops=lambda s: 10.0 * s["rows"] * s["cols"],
    bytes=lambda s, e: 3.0 * e * s["rows"] * s["cols"],
    sizes=lambda o, a, b: (a.numel(),),
    dims=dims_of(rows=(1, 0), cols=(1, 1)),
    clauses=CLAUSES,
    shapes=SHAPES,
    slack=_slack,
    tolerances={"float32": Tolerance(1e-6, 1e-3), "bfloat16": Tolerance(2e-2, 2e-2),
                "float16": Tolerance(2e-3, 2e-3)},
))
