"""matvec_q8_0: GGUF q8_0 weight x activations, dequantise-and-dot (decode)."""

from strata.kernels.ops._matvec import register_matvec

SPEC = register_matvec("q8_0")
