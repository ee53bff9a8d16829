// strata-kernel: op=attention_cached_f16 dialect=c entry=strata_attention_cached_f16 requires=avx2,fma,f16c
/* attention_cached over a float16 KV cache: strata_attention.h's flash-decoding driver with
 * its K/V loads converted by F16C (STRATA_KV_HALF); queries, scores, the online softmax and
 * the output stay float32. q [H,T,D] float; k, v [Hkv,C,D] float16; P = pos[0]. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#define STRATA_KV_HALF
#include "strata_attention.h"

void strata_attention_cached_f16(float *out, const float *q, const uint16_t *k,
                                 const uint16_t *v, const int64_t *pos, int64_t H,
                                 int64_t Hkv, int64_t T, int64_t C, int64_t D, float scale) {
    cached_attention(out, q, k, v, pos[0], 0, H, Hkv, T, C, D, scale);
}
