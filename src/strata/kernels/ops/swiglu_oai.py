"""swiglu_oai: gpt-oss's clamped SwiGLU gate, with ggml's CPU numerics.

out = x·sigmoid(alpha·x)·(y + 1) with x = min(a, 7), y = clamp(b, -7, 7) and alpha = 1.702:
a (the gate) is clamped from above only, b (the up projection) on both sides, and the up
branch carries +1. alpha and the limit are fixed: llama.cpp's graph builder passes them as
constants for gpt-oss (LLM_FFN_SWIGLU_OAI_MOE), not read from the GGUF. ggml's CPU kernel
(ggml_compute_forward_swiglu_oai_f32) computes x / (1 + expf(alpha·(-x)))·(y + 1) in
float32: for a ≪ 0 the exp overflows to inf and the gate is -0, never NaN. The float64
oracle computes the same formula; float32 evaluation (an exp, a division, two products) is a
few ulp off it, inside the default tolerance. a and b are [rows, cols] like silu_mul's; the
shapes are the gates' (silu_mul.SHAPES).
"""

from strata.kernels.ops._clauses import ragged, saturate
from strata.kernels.ops.silu_mul import SHAPES, gate_inputs
from strata.kernels.spec import Clause, KernelSpec, dims_of, register

ALPHA = 1.702  # gpt-oss's sigmoid steepness (llama.cpp: constexpr float alpha = 1.702f)
LIMIT = 7.0  # gpt-oss's clamp (constexpr float limit = 7.0f)

# clamp clause: gates above the limit, ups beyond it on both sides (x·sigmoid(alpha·x) of
# a clamped gate is ~7, so an unclamped a or b is off by O(1)·|a| or O(1)·|b|)
OVER_A = (7.5, 12.0, 50.0, 1e3, 8.0, 1e4)
OVER_B = (7.5, -12.0, 50.0, -1e3, -8.0, 1e4)


def _clamp(inputs, shape, seed):
    """Every fourth element of a (from the first) above the limit, every fourth of b (from
    the second) beyond ±limit: each clamp alone is exercised."""
    import torch

    a, b = inputs[0].view(-1), inputs[1].view(-1)
    for t, vals, start in ((a, OVER_A, 0), (b, OVER_B, 1)):
        n = t[start::4].numel()
        v = torch.tensor(vals).repeat(n // len(vals) + 1)[:n].roll(seed)
        t[start::4] = v.to(dtype=t.dtype, device=t.device)


CLAUSES = (
    Clause("clamp", "a is clamped from above to 7 (x = min(a, 7)) and b to [-7, 7] before the "
           "gate: a = 50 gates as a = 7, b = ±50 counts as ±7.", {"rows": 4, "cols": 33},
           _clamp),
    Clause("saturation", "A large |a| (±89 to ±1e4) saturates: a ≥ 7 gates as 7, and a ≪ 0 "
           "gives 0 (e^(-alpha·a) overflows float32), never NaN.", {"rows": 4, "cols": 33},
           saturate),
    ragged({"rows": 3, "cols": 7}, "n = rows·cols"),
)


def _reference(a, b):
    import torch

    x = a.clamp(max=LIMIT)
    y = b.clamp(-LIMIT, LIMIT)
    return x / (1.0 + torch.exp(ALPHA * -x)) * (y + 1.0)


SPEC = register(KernelSpec(
    name="swiglu_oai",
    summary="x·sigmoid(1.702·x)·(clamp(b,±7) + 1), x = min(a,7) (gpt-oss's gate, ggml's)",
    inputs=("a", "b"),
    make_inputs=gate_inputs,
    out_shape=lambda s: (s["rows"], s["cols"]),
    reference=_reference,
    flops=lambda s: 8.0 * s["rows"] * s["cols"],
    bytes=lambda s, e: 3.0 * e * s["rows"] * s["cols"],
    sizes=lambda o, a, b: (a.numel(),),
    dims=dims_of(rows=(1, 0), cols=(1, 1)),
    clauses=CLAUSES,
    shapes=SHAPES,
))
