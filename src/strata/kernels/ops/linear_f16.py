"""linear_f16: out[B,N] = f16(x)[B,K] @ w[N,K]ᵀ with a GGUF F16 weight (float16, whatever
the activations' dtype: a fixed dtype of the spec), accumulated in float32.

These are ggml's F16 numerics (ggml_vec_dot_f16): the activation row is first rounded to
float16 (round to nearest, ties to even), then each product f16(x)·w is summed in float32.
A product of two float16 values (11-bit significands) is exact in float32, so a correct
kernel differs from the float64 oracle only by the order of its float32 sums: about
√K·2⁻²⁴ of the output's scale. Not rounding x first changes every product by up to 2⁻¹¹
relative, ≈ 2⁻¹²·rms ≈ 2.4e-4·rms on the output; the float32 tolerance (atol 1e-5·max(1,
rms), rtol 1e-5) sits between the two, so it separates a kernel that rounds x from one that
does not (tests/test_kernels_linear_f.py checks that it does).
"""

from strata.kernels.ops._linear_f import RAGGED, linear_spec
from strata.kernels.spec import Clause, Tolerance, register


def _ties(inputs, shape, seed):
    """Every x exactly halfway between two neighbouring float16 values (x's float16 value
    and the next one away from zero)."""
    import torch

    x = inputs[0]
    h = x.to(torch.float16)
    away = (h.view(torch.int16) + 1).view(torch.float16)  # sign-magnitude: one ulp further
    x.copy_(((h.to(torch.float32) + away.to(torch.float32)) / 2).to(x.dtype))


X_TIES = Clause("x_ties", "x is rounded to float16 with ties to even before the products: "
                "an x exactly halfway between two float16 values takes the even one.",
                {"B": 3, "N": 9, "K": 64}, _ties)


def _reference(x, w):
    import torch

    return x.to(torch.float16).to(x.dtype) @ w.to(x.dtype).T


def _eager(x, w):
    import torch
    import torch.nn.functional as F

    return F.linear(x.to(torch.float16).to(x.dtype), w.to(x.dtype))


SPEC = register(linear_spec(
    "linear_f16", "out = f16(x) @ wᵀ, GGUF F16 weight [N,K] (ggml's F16 numerics)",
    "float16", 2, _reference, _eager,
    {"float32": Tolerance(1e-5, 1e-5), "bfloat16": Tolerance(2e-2, 2e-2),
     "float16": Tolerance(2e-3, 2e-3)}, clauses=(X_TIES, RAGGED)))
