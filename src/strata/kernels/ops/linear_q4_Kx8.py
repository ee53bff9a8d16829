"""linear_q4_Kx8: linear_q4_K (ggml's numerics, x quantised to q8_K) on weights repacked at load
into strata's x8 layout (_kquant_x8.py: eight rows interleaved per super-block, the same
bytes), which a one-row decode dot reads with one SIMD lane per weight row."""

from strata.kernels.ops._linear_k import register_linear_k

SPEC = register_linear_k("q4_K", x8=True)
