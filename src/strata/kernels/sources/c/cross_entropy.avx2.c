// strata-kernel: op=cross_entropy dialect=c entry=strata_cross_entropy requires=avx2,fma
// AVX2/FMA cross entropy: per row a max pass and one exp-sum pass (vectorised exp),
// out = log(sum) + max - logits[target]. A target outside [0, V) (e.g. ignore_index -100)
// yields 0. Rows in parallel only when the work amortises an OpenMP team.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "strata_simd.h"

/* Below this much work (elements, or multiply-adds for attention) the kernel stays on one
   thread: a fork-join costs microseconds on a quiet machine and milliseconds when the cores
   are shared (a descheduled worker stalls the join), so only ~1 ms+ of serial work forks.
   Override with -DPAR_MIN_WORK=... */
#ifndef PAR_MIN_WORK
#define PAR_MIN_WORK ((int64_t)(1 << 22))
#endif

static float ce_row(const float *x, int64_t V, int64_t t) {
    if (t < 0 || t >= V) return 0.0f;
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    int64_t c = 0;
    for (; c + 32 <= V; c += 32) {
        m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + c));
        m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + c + 8));
        m2 = _mm256_max_ps(m2, _mm256_loadu_ps(x + c + 16));
        m3 = _mm256_max_ps(m3, _mm256_loadu_ps(x + c + 24));
    }
    for (; c + 8 <= V; c += 8) m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + c));
    int64_t rem = V - c;
    __m256i mask = tailmask(rem);
    if (rem) m1 = _mm256_max_ps(m1, _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + c, mask),
                                                     _mm256_castsi256_ps(mask)));
    float m = hmax256_ps(_mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
    const __m256 mv = _mm256_set1_ps(m);
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    c = 0;
    for (; c + 32 <= V; c += 32) {
        s0 = _mm256_add_ps(s0, exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), mv)));
        s1 = _mm256_add_ps(s1, exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c + 8), mv)));
        s2 = _mm256_add_ps(s2, exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c + 16), mv)));
        s3 = _mm256_add_ps(s3, exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c + 24), mv)));
    }
    for (; c + 8 <= V; c += 8) s0 = _mm256_add_ps(s0, exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), mv)));
    if (rem) s1 = _mm256_add_ps(s1, _mm256_and_ps(exp256_ps(_mm256_sub_ps(_mm256_maskload_ps(x + c, mask), mv)),
                                                  _mm256_castsi256_ps(mask)));
    /* per-lane float partial sums of values in (0, 1]; summed in double at the end */
    double s = hsum256_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    return (float)(log(s) + (double)m - (double)x[t]);
}

void strata_cross_entropy(float *out, const float *logits, const int64_t *target,
                          int64_t rows, int64_t V) {
    if (V <= 0) return;
    if (rows < 2 || rows * V < PAR_MIN_WORK) {
        for (int64_t r = 0; r < rows; r++) out[r] = ce_row(logits + r * V, V, target[r]);
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; r++) out[r] = ce_row(logits + r * V, V, target[r]);
    }
}
