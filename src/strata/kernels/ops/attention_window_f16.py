"""attention_window_f16: attention_window over a float16 KV cache (k, v [Hkv,C,D] float16;
q, the output and everything else as attention_window): attention_window's spec with the cache's
dtype fixed (strata.kernels.ops._kv_f16: what changes, and why the oracle reads the
float16 values).
"""

from strata.kernels.ops._kv_f16 import f16_cache
from strata.kernels.ops.attention_window import SPEC as BASE
from strata.kernels.spec import register

SPEC = register(f16_cache(BASE))
