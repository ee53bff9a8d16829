// strata-kernel: op=attention_cached_q8_0 dialect=c entry=strata_attention_cached_q8_0 requires=avx2,fma,f16c
/* attention_cached over a q8_0 KV cache (STRATA_KV_Q8_0: each block's int8 values widened and
 * scaled by its fp16 scale as they are loaded). q [H,T,D] float; k, v [Hkv,C,D/32*34] GGUF
 * q8_0 blocks along D (D a multiple of 32); P = pos[0]. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#define STRATA_KV_Q8_0
#include "strata_attention.h"

void strata_attention_cached_q8_0(float *out, const float *q, const uint8_t *k,
                                  const uint8_t *v, const int64_t *pos, int64_t H,
                                  int64_t Hkv, int64_t T, int64_t C, int64_t D, float scale) {
    cached_attention(out, q, k, v, pos[0], 0, H, Hkv, T, C, D, scale);
}
