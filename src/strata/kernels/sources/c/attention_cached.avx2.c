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

/* Below this many multiply-adds the kernel stays on one thread (a fork-join costs
   microseconds on a quiet machine, much more when the cores are shared). */
#ifndef PAR_MIN_WORK
#define PAR_MIN_WORK ((int64_t)1 << 18)
#endif

/* Item `item` = ((g * quads + quad) * T + t): queries of heads g*G + 4*quad + j, row t,
   over keys 0..P+t of kv head g. */
static void cached_item(float *out, const float *q, const float *k, const float *v,
                        int64_t H, int64_t Hkv, int64_t T, int64_t C, int64_t D, int64_t P,
                        float scale, int64_t item, int64_t quads, float *acc) {
    const int64_t G = H / Hkv, t = item % T, gq = item / T, g = gq / quads;
    const int64_t j0 = (gq % quads) * 4;
    const int nq = (int)(G - j0 < 4 ? G - j0 : 4);
    float *o[4];
    const float *qp[4];
    for (int j = 0; j < 4; j++) {  /* padding lanes repeat the last query; not stored */
        const int64_t h = g * G + j0 + (j < nq ? j : nq - 1);
        o[j] = out + (h * T + t) * D;
        qp[j] = q + (h * T + t) * D;
    }
    decode_quad(o, qp, k + g * C * D, v + g * C * D, P + t + 1, D, scale, nq, acc);
}

void strata_attention_cached(float *out, const float *q, const float *k, const float *v,
                             const int64_t *pos, int64_t H, int64_t Hkv, int64_t T,
                             int64_t C, int64_t D, float scale) {
    if (H <= 0 || T <= 0 || D <= 0 || Hkv <= 0) return;
    const int64_t P = pos[0], G = H / Hkv, quads = (G + 3) / 4, items = Hkv * quads * T;
    const int64_t work = H * D * (T * P + T * (T + 1) / 2);
    if (items < 2 || work < PAR_MIN_WORK) {
        float *acc = (float *)malloc((size_t)(4 * D) * sizeof(float));
        if (!acc) return;
        for (int64_t it = 0; it < items; it++)
            cached_item(out, q, k, v, H, Hkv, T, C, D, P, scale, it, quads, acc);
        free(acc);
        return;
    }
#pragma omp parallel
    {
        float *acc = (float *)malloc((size_t)(4 * D) * sizeof(float));
        /* consecutive items share a kv head (locality); causal rows differ in cost */
#pragma omp for schedule(dynamic, 4)
        for (int64_t it = 0; it < items; it++)
            if (acc) cached_item(out, q, k, v, H, Hkv, T, C, D, P, scale, it, quads, acc);
        free(acc);
    }
}
