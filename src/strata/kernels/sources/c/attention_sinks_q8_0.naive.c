// strata-kernel: op=attention_sinks_q8_0 dialect=c entry=strata_attention_sinks_q8_0
/* Portable reference: attention_sinks over a q8_0 KV cache (strata_attention_ref.h).
 * q [H,T,D] float; k, v [Hkv,C,D/32*34] q8_0 blocks along D; pos = (P, W); sinks [H] float. */
#include <stdint.h>
#include "strata_attention_ref.h"

void strata_attention_sinks_q8_0(float *out, const float *q, const uint8_t *k,
                                 const uint8_t *v, const int64_t *pos, const float *sinks,
                                 int64_t H, int64_t Hkv, int64_t T, int64_t C, int64_t D,
                                 float scale) {
    const int64_t W = pos[1] > 0 ? pos[1] : 0;
    attention_ref_kv(out, q, k, v, kv_read_q8_0, sinks, pos[0], W, H, Hkv, T, C, D,
                     scale);
}
