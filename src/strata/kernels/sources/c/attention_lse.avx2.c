// strata-kernel: op=attention_lse dialect=c entry=strata_attention_lse requires=avx2,fma
// AVX2/FMA causal GQA attention that also returns each query's logsumexp (the training
// forward): out = [o (H*T*D) | lse (H*T)], q [H,T,D], k/v [Hkv,T,D], head h reads kv head
// h / (H/Hkv). Per query row: q.k for 4 keys at a time (hadd reduction), max, vectorised
// exp, lse = scale*max + log(sum), normalised probabilities, then P.V with register
// accumulators over D blocks. Rows are independent, so (h, t) rows run in parallel
// (dynamic schedule: causal rows differ in cost) and the result never depends on the team.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "strata_attention.h"

/* Below this many multiply-adds the kernel stays on one thread (~0.5 ms of serial work: a
   fork-join on shared cores can cost that much). Override with -DPAR_MIN_WORK=... */
#ifndef PAR_MIN_WORK
#define PAR_MIN_WORK ((int64_t)(1 << 20))
#endif

/* p[0..n) <- softmax(p * scale) in place; returns logsumexp(p * scale). */
static float softmax_lse(float *p, int64_t n, float scale) {
    const __m256 sc = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    int64_t n8 = n & ~(int64_t)7;
    __m256i tm = tailmask(n - n8);
    /* the max of p*scale: of p*scale directly, so a negative scale needs no special case */
    __m256 mx = ninf;
    int64_t s = 0;
    for (; s < n8; s += 8) mx = _mm256_max_ps(mx, _mm256_mul_ps(_mm256_loadu_ps(p + s), sc));
    if (s < n) mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_mul_ps(_mm256_maskload_ps(p + s, tm), sc), _mm256_castsi256_ps(tm)));
    float m = hmax256_ps(mx);
    const __m256 mv = _mm256_set1_ps(m);
    __m256 sum = _mm256_setzero_ps();
    for (s = 0; s < n8; s += 8) {
        __m256 e = exp256_ps(_mm256_fmsub_ps(_mm256_loadu_ps(p + s), sc, mv));
        _mm256_storeu_ps(p + s, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (s < n) {
        __m256 e = _mm256_and_ps(exp256_ps(_mm256_fmsub_ps(_mm256_maskload_ps(p + s, tm), sc, mv)), _mm256_castsi256_ps(tm));
        _mm256_maskstore_ps(p + s, tm, e);
        sum = _mm256_add_ps(sum, e);
    }
    float total = hsum256_ps(sum);
    const __m256 inv = _mm256_set1_ps(1.0f / total);
    for (s = 0; s < n8; s += 8) _mm256_storeu_ps(p + s, _mm256_mul_ps(_mm256_loadu_ps(p + s), inv));
    if (s < n) _mm256_maskstore_ps(p + s, tm, _mm256_mul_ps(_mm256_maskload_ps(p + s, tm), inv));
    return m + logf(total);
}

static void attn_row(float *out, const float *q, const float *k, const float *v,
                     int64_t H, int64_t Hkv, int64_t T, int64_t D, float scale, int64_t r, float *p) {
    int64_t h = r / T, t = r % T, g = h / (H / Hkv);
    const float *kh = k + g * T * D, *vh = v + g * T * D;
    qk_scores(p, q + r * D, kh, t + 1, D);
    out[H * T * D + r] = softmax_lse(p, t + 1, scale);
    pv_accum(out + r * D, p, vh, t + 1, D);
}

void strata_attention_lse(float *out, const float *q, const float *k, const float *v,
                          int64_t H, int64_t Hkv, int64_t T, int64_t D, float scale) {
    if (T <= 0 || D <= 0 || H <= 0) return;
    int64_t nrows = H * T;
    double work = (double)nrows * (double)(T + 1) * (double)D;  /* q.k and p.v, causal half */
    if (nrows < 2 || work < (double)PAR_MIN_WORK) {
        float *p = (float *)malloc((size_t)T * sizeof(float));
        if (!p) return;
        for (int64_t r = 0; r < nrows; r++) attn_row(out, q, k, v, H, Hkv, T, D, scale, r, p);
        free(p);
    } else {
#pragma omp parallel
        {
            float *p = (float *)malloc((size_t)T * sizeof(float));
            /* rows are visited longest-first within each head block for better balance */
#pragma omp for schedule(dynamic, 4)
            for (int64_t i = 0; i < nrows; i++) {
                int64_t h = i / T, t = T - 1 - i % T;
                if (p) attn_row(out, q, k, v, H, Hkv, T, D, scale, h * T + t, p);
            }
            free(p);
        }
    }
}
