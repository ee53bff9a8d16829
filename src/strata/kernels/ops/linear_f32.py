"""linear_f32: out[B,N] = x[B,K] @ w[N,K]ᵀ, a GGUF F32 weight as stored (row n holds the K
weights of output n). B = 1 is the decode matvec, B > 1 the prefill matmul.

Tolerance (float32: atol 1e-5·max(1, rms), rtol 1e-5, as matmul): the products are the
same; only the order of the float32 sums differs from the float64 oracle, an error of about
√K·2⁻²⁴ of the output's scale at the verify sizes.
"""

from strata.kernels.ops._linear_f import linear_spec
from strata.kernels.spec import Tolerance, register


def _reference(x, w):
    return x @ w.T


def _eager(x, w):
    import torch.nn.functional as F

    return F.linear(x, w)


SPEC = register(linear_spec(
    "linear_f32", "out = x @ wᵀ, GGUF F32 weight [N,K]", None, None, _reference, _eager,
    {"float32": Tolerance(1e-5, 1e-5), "bfloat16": Tolerance(2e-2, 2e-2),
     "float16": Tolerance(2e-3, 2e-3)}))
