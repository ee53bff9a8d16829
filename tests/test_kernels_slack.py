"""Per-element slack (KernelSpec.slack): what an op's own float32 numerics leave open is
admitted, and nothing more — gelu_mul's subnormal GELU tail under heavy-tailed b."""

from __future__ import annotations

import math

import torch

from strata.kernels import checks
from strata.kernels.ops.gelu_mul import SPEC, ggml_gelu


def _vectorised_gelu_mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """gelu_mul as the AVX2 kernel computes it: tanh(u) = 1 - 2 / (1 + e^(2u)) in float32
    (a different float32 evaluation of 1 + tanh(u) than the reference's)."""
    x = a.clamp(-10, 10).half().float()
    u = (math.sqrt(2 / math.pi) * x * (1 + 0.044715 * x * x)).clamp(-40, 40)
    th = 1 - 2 / (1 + torch.exp(2 * u))
    g = (0.5 * x * (1 + th)).half().float()
    return torch.where(a <= -10, 0.0, torch.where(a >= 10, a, g)) * b


def test_a_correct_kernel_passes_where_b_is_heavy_and_the_gelu_subnormal() -> None:
    a = torch.linspace(-4.8, -4.2, 4001)
    b = torch.full_like(a, -180.0)  # a heavy-tailed b: verify's inputs reach ±250
    ref = ggml_gelu(a) * b
    out = _vectorised_gelu_mul(a, b)
    assert not torch.equal(out, ref)  # the two float32 evaluations do differ here
    assert checks.compare(out, ref, SPEC.tolerance("float32")) is not None  # atol alone
    assert checks.compare(out, ref, SPEC.tolerance_for("float32", [a, b])) is None


def test_a_kernel_that_drops_the_tail_is_still_wrong() -> None:
    a = torch.linspace(-4.6, -3.0, 2001)
    b = torch.full_like(a, -180.0)
    ref = ggml_gelu(a) * b
    cheat = torch.where(a < -4.4, torch.zeros_like(a), ref)  # skip the "negligible" tail
    bad = checks.compare(cheat, ref, SPEC.tolerance_for("float32", [a, b]))
    assert bad is not None and bad.reason == "wrong_result", bad
