"""linear_q5_1: x @ GGUF q5_1 weight^T with llama.cpp's numerics (x quantised to q8_1 blocks,
integer dots per block, the min term through s_x); see _linear_q.py for the exact rules."""

from strata.kernels.ops._linear_q import register_linear

SPEC = register_linear("q5_1")
