// strata-kernel: op=attention_sinks_f16 dialect=c entry=strata_attention_sinks_f16 requires=avx2,fma,f16c
/* attention_sinks over a float16 KV cache (STRATA_KV_HALF: K/V converted by F16C as they
 * are loaded). q [H,T,D] float; k, v [Hkv,C,D] float16; pos = (P, W); sinks [H] float. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#define STRATA_KV_HALF
#include "strata_attention.h"

void strata_attention_sinks_f16(float *out, const float *q, const uint16_t *k,
                                const uint16_t *v, const int64_t *pos, const float *sinks,
                                int64_t H, int64_t Hkv, int64_t T, int64_t C, int64_t D,
                                float scale) {
    const int64_t W = pos[1] > 0 ? pos[1] : 0;
    cached_attention_sinks(out, q, k, v, sinks, pos[0], W, H, Hkv, T, C, D, scale);
}
