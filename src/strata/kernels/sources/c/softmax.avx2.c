// strata-kernel: op=softmax dialect=c entry=strata_softmax requires=avx2,fma
// AVX2/FMA softmax: per row a max pass, an exp pass (writes e^(x-max) and sums it), and a
// scaling pass. Rows run in parallel only when the total work amortises an OpenMP team.
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

static void softmax_row(float *o, const float *x, int64_t C) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    __m256 m0 = ninf, m1 = ninf, m2 = ninf, m3 = ninf;
    int64_t c = 0;
    for (; c + 32 <= C; c += 32) {
        m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + c));
        m1 = _mm256_max_ps(m1, _mm256_loadu_ps(x + c + 8));
        m2 = _mm256_max_ps(m2, _mm256_loadu_ps(x + c + 16));
        m3 = _mm256_max_ps(m3, _mm256_loadu_ps(x + c + 24));
    }
    for (; c + 8 <= C; c += 8) m0 = _mm256_max_ps(m0, _mm256_loadu_ps(x + c));
    int64_t rem = C - c;
    __m256i mask = tailmask(rem);
    if (rem) m1 = _mm256_max_ps(m1, _mm256_blendv_ps(ninf, _mm256_maskload_ps(x + c, mask),
                                                     _mm256_castsi256_ps(mask)));
    const __m256 mv = _mm256_set1_ps(hmax256_ps(_mm256_max_ps(_mm256_max_ps(m0, m1),
                                                              _mm256_max_ps(m2, m3))));
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    c = 0;
    for (; c + 16 <= C; c += 16) {
        __m256 e0 = exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), mv));
        __m256 e1 = exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c + 8), mv));
        _mm256_storeu_ps(o + c, e0);
        _mm256_storeu_ps(o + c + 8, e1);
        s0 = _mm256_add_ps(s0, e0);
        s1 = _mm256_add_ps(s1, e1);
    }
    for (; c + 8 <= C; c += 8) {
        __m256 e0 = exp256_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), mv));
        _mm256_storeu_ps(o + c, e0);
        s0 = _mm256_add_ps(s0, e0);
    }
    if (rem) {
        __m256 e0 = exp256_ps(_mm256_sub_ps(_mm256_maskload_ps(x + c, mask), mv));
        e0 = _mm256_and_ps(e0, _mm256_castsi256_ps(mask));
        _mm256_maskstore_ps(o + c, mask, e0);
        s1 = _mm256_add_ps(s1, e0);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / hsum256_ps(_mm256_add_ps(s0, s1)));
    c = 0;
    for (; c + 16 <= C; c += 16) {
        _mm256_storeu_ps(o + c, _mm256_mul_ps(_mm256_loadu_ps(o + c), inv));
        _mm256_storeu_ps(o + c + 8, _mm256_mul_ps(_mm256_loadu_ps(o + c + 8), inv));
    }
    for (; c + 8 <= C; c += 8) _mm256_storeu_ps(o + c, _mm256_mul_ps(_mm256_loadu_ps(o + c), inv));
    if (rem) _mm256_maskstore_ps(o + c, mask, _mm256_mul_ps(_mm256_maskload_ps(o + c, mask), inv));
}

void strata_softmax(float *out, const float *x, int64_t rows, int64_t cols) {
    if (cols <= 0) return;
    if (rows < 2 || rows * cols < PAR_MIN_WORK) {
        for (int64_t r = 0; r < rows; r++) softmax_row(out + r * cols, x + r * cols, cols);
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; r++) softmax_row(out + r * cols, x + r * cols, cols);
    }
}
