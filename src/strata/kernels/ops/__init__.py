"""The ops of the kernel lab; importing this package registers every KernelSpec."""

from strata.kernels.ops import (  # noqa: F401  (registration by import)
    attention,
    cross_entropy,
    decode_attention,
    layernorm,
    matmul,
    matvec_q4_0,
    matvec_q8_0,
    rmsnorm,
    rope,
    silu_mul,
    softmax,
)
