"""attention_cached_q8_0: attention_cached over a q8_0 KV cache (k, v [Hkv,C,D/32*34] uint8,
GGUF q8_0 blocks along D; q, the output and everything else as attention_cached):
attention_cached's spec with the cache's blocks (strata.kernels.ops._kv_q8_0: what changes,
and why the oracle reads the blocks' values).
"""

from strata.kernels.ops._kv_q8_0 import q8_0_cache
from strata.kernels.ops.attention_cached import SPEC as BASE
from strata.kernels.spec import register

SPEC = register(q8_0_cache(BASE))
