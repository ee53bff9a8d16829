// strata-kernel: op=attention_sinks dialect=c entry=strata_attention_sinks requires=avx2,fma
/* AVX2/FMA gpt-oss attention of T queries over a KV cache with a sink logit per head, GQA,
 * optionally windowed: attention_cached's flash-decoding quads (strata_attention.h) with each
 * query head's sink merged into the online softmax after the keys (running max and sum, no
 * value, unscaled), as ggml's flash_attn_ext with sinks.
 *
 * q [H,T,D]; k, v [Hkv,C,D]; pos int64 [2]: P = pos[0] cache rows precede the queries
 * (P + T <= C), W = pos[1]: query t attends rows max(0, P+t-W+1)..P+t when W > 0, 0..P+t when
 * W = 0; rows before its range and after its own are never touched. sinks [H]. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "strata_attention.h"

void strata_attention_sinks(float *out, const float *q, const float *k, const float *v,
                            const int64_t *pos, const float *sinks, int64_t H, int64_t Hkv,
                            int64_t T, int64_t C, int64_t D, float scale) {
    const int64_t W = pos[1] > 0 ? pos[1] : 0;
    cached_attention_sinks(out, q, k, v, sinks, pos[0], W, H, Hkv, T, C, D, scale);
}
