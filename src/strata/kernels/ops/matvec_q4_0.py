"""matvec_q4_0: GGUF q4_0 weight x activations, dequantise-and-dot (decode)."""

from strata.kernels.ops._matvec import register_matvec

SPEC = register_matvec("q4_0")
