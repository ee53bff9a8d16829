// strata-kernel: op=attention_cached dialect=c entry=strata_attention_cached requires=avx2,fma
/* AVX2/FMA causal attention of T queries over a KV cache, GQA (flash-decoding style).
 *
 * q [H,T,D]; k, v [Hkv,C,D]; P = pos[0] cache rows precede the queries (P + T <= C). Query t
 * of head h attends rows 0..P+t of kv head h / (H/Hkv); rows from P+t+1 on are never
 * touched (each query's loop ends at its own last key).
 *
 * A work item is (kv head, quad of the query heads that share it, query row t): the up to
 * four queries read each K/V row once. Keys are swept in blocks of 32 with an online
 * softmax (running max and sum per query, block rescale); q.k takes 2 keys x 4 queries per
 * step, P.V keeps 16-wide D slices of the four outputs in registers. Items run in parallel
 * (OpenMP, over heads and query rows) when the work amortises a team; every item is
 * computed the same way on any thread, so results do not depend on the thread count.
 */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "strata_attention.h"

void strata_attention_cached(float *out, const float *q, const float *k, const float *v,
                             const int64_t *pos, int64_t H, int64_t Hkv, int64_t T,
                             int64_t C, int64_t D, float scale) {
    cached_attention(out, q, k, v, pos[0], 0, H, Hkv, T, C, D, scale);
}
