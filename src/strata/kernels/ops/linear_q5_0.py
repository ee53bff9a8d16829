"""linear_q5_0: x @ GGUF q5_0 weight^T with llama.cpp's numerics (x quantised to q8_0 blocks,
integer dots per block); see _linear_q.py for the exact rules."""

from strata.kernels.ops._linear_q import register_linear

SPEC = register_linear("q5_0")
