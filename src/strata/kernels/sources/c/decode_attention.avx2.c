// strata-kernel: op=decode_attention dialect=c entry=strata_decode_attention requires=avx2,fma
// AVX2/FMA decode attention (flash-decoding style). The query heads sharing one kv head
// are processed 4 at a time, so each K/V row is read once per 4 queries; S is swept in
// blocks of 32 keys with an online softmax (running max / sum per query, block rescale).
// q.k: 2 keys x 4 queries per step (8 accumulators, hadd reduction); P.V: register
// accumulators over 16-wide D slices. Work items (kv head, query quad) run in parallel
// only when the total work amortises an OpenMP team.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "strata_attention.h"

/* Below this much work (elements, or multiply-adds for attention) the kernel stays on one
   thread: a fork-join costs microseconds on a quiet machine and milliseconds when the cores
   are shared (a descheduled worker stalls the join), so only ~1 ms+ of serial work forks.
   Override with -DPAR_MIN_WORK=... */
#ifndef PAR_MIN_WORK
#define PAR_MIN_WORK ((int64_t)(1 << 25))
#endif

static void decode_item(float *out, const float *q, const float *k, const float *v,
                        int64_t H, int64_t Hkv, int64_t S, int64_t D, float scale,
                        int64_t item, int64_t quads, float *acc) {
    int64_t G = H / Hkv, g = item / quads, j0 = (item % quads) * 4;
    int nq = (int)(G - j0 < 4 ? G - j0 : 4);
    float *o[4];
    const float *qp[4];
    for (int j = 0; j < 4; j++) {
        int64_t h = g * G + j0 + (j < nq ? j : nq - 1);
        o[j] = out + h * D;
        qp[j] = q + h * D;
    }
    decode_quad(o, qp, k + g * S * D, v + g * S * D, S, D, scale, nq, acc);
}

void strata_decode_attention(float *out, const float *q, const float *k, const float *v,
                             int64_t H, int64_t Hkv, int64_t S, int64_t D, float scale) {
    if (H <= 0 || D <= 0 || Hkv <= 0) return;
    if (S <= 0) {  /* empty cache: softmax over nothing; follow torch (NaN-free zeros) */
        for (int64_t i = 0; i < H * D; i++) out[i] = 0.0f;
        return;
    }
    int64_t G = H / Hkv, quads = (G + 3) / 4, items = Hkv * quads;
    if (items < 2 || H * S * D < PAR_MIN_WORK) {
        float *acc = (float *)malloc((size_t)(4 * D) * sizeof(float));
        if (!acc) return;
        for (int64_t it = 0; it < items; it++) decode_item(out, q, k, v, H, Hkv, S, D, scale, it, quads, acc);
        free(acc);
    } else {
#pragma omp parallel
        {
            float *acc = (float *)malloc((size_t)(4 * D) * sizeof(float));
#pragma omp for schedule(static)
            for (int64_t it = 0; it < items; it++)
                if (acc) decode_item(out, q, k, v, H, Hkv, S, D, scale, it, quads, acc);
            free(acc);
        }
    }
}
