"""attention_sinks_q8_0: attention_sinks over a q8_0 KV cache (k, v [Hkv,C,D/32*34] uint8,
GGUF q8_0 blocks along D; q, the output and everything else as attention_sinks):
attention_sinks's spec with the cache's blocks (strata.kernels.ops._kv_q8_0: what changes,
and why the oracle reads the blocks' values).
"""

from strata.kernels.ops._kv_q8_0 import q8_0_cache
from strata.kernels.ops.attention_sinks import SPEC as BASE
from strata.kernels.spec import register

SPEC = register(q8_0_cache(BASE))
