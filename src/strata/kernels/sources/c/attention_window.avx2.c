// strata-kernel: op=attention_window dialect=c entry=strata_attention_window requires=avx2,fma
/* AVX2/FMA sliding-window attention of T queries over a KV cache, GQA: attention_cached's
 * flash-decoding quads (strata_attention.h) over each query's last W keys.
 *
 * q [H,T,D]; k, v [Hkv,C,D]; pos int64 [2]: P = pos[0] cache rows precede the queries
 * (P + T <= C), W = pos[1] >= 1 the window. Query t attends rows max(0, P+t-W+1)..P+t:
 * rows before its window and after its own are never touched. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "strata_attention.h"

void strata_attention_window(float *out, const float *q, const float *k, const float *v,
                             const int64_t *pos, int64_t H, int64_t Hkv, int64_t T,
                             int64_t C, int64_t D, float scale) {
    const int64_t W = pos[1] >= 1 ? pos[1] : 1;
    cached_attention(out, q, k, v, pos[0], W, H, Hkv, T, C, D, scale);
}
