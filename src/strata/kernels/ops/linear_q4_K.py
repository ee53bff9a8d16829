"""linear_q4_K: x @ GGUF q4_K weight^T with llama.cpp's numerics (x quantised to q8_K, integer
dots per super-block); see _linear_k.py and _kquant.py for the exact rules."""

from strata.kernels.ops._linear_k import register_linear_k

SPEC = register_linear_k("q4_K")
