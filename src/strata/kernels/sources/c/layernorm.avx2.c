// strata-kernel: op=layernorm dialect=c entry=strata_layernorm requires=avx2,fma
// AVX2/FMA LayerNorm: a mean pass, a centred variance pass (biased, numerically stable),
// and a fused (x-mean)*rstd*w+b pass. Rows in parallel only for large work.
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

static void layernorm_row(float *o, const float *x, const float *w, const float *b,
                          int64_t C, float eps) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t c = 0;
    for (; c + 32 <= C; c += 32) {
        a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + c));
        a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x + c + 8));
        a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x + c + 16));
        a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x + c + 24));
    }
    for (; c + 8 <= C; c += 8) a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x + c));
    int64_t rem = C - c;
    __m256i mask = tailmask(rem);
    if (rem) a1 = _mm256_add_ps(a1, _mm256_maskload_ps(x + c, mask));
    float mean = (float)((double)hsum256_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3))) / (double)C);
    const __m256 mv = _mm256_set1_ps(mean);
    a0 = a1 = a2 = a3 = _mm256_setzero_ps();
    c = 0;
    for (; c + 32 <= C; c += 32) {
        __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(x + c), mv);
        __m256 d1 = _mm256_sub_ps(_mm256_loadu_ps(x + c + 8), mv);
        __m256 d2 = _mm256_sub_ps(_mm256_loadu_ps(x + c + 16), mv);
        __m256 d3 = _mm256_sub_ps(_mm256_loadu_ps(x + c + 24), mv);
        a0 = _mm256_fmadd_ps(d0, d0, a0);
        a1 = _mm256_fmadd_ps(d1, d1, a1);
        a2 = _mm256_fmadd_ps(d2, d2, a2);
        a3 = _mm256_fmadd_ps(d3, d3, a3);
    }
    for (; c + 8 <= C; c += 8) { __m256 d0 = _mm256_sub_ps(_mm256_loadu_ps(x + c), mv); a0 = _mm256_fmadd_ps(d0, d0, a0); }
    if (rem) {
        __m256 d0 = _mm256_and_ps(_mm256_sub_ps(_mm256_maskload_ps(x + c, mask), mv), _mm256_castsi256_ps(mask));
        a1 = _mm256_fmadd_ps(d0, d0, a1);
    }
    double var = (double)hsum256_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3))) / (double)C;
    const __m256 r = _mm256_set1_ps((float)(1.0 / sqrt(var + (double)eps)));
    c = 0;
    for (; c + 8 <= C; c += 8) {
        __m256 y = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + c), mv), r);
        _mm256_storeu_ps(o + c, _mm256_fmadd_ps(y, _mm256_loadu_ps(w + c), _mm256_loadu_ps(b + c)));
    }
    if (rem) {
        __m256 y = _mm256_mul_ps(_mm256_sub_ps(_mm256_maskload_ps(x + c, mask), mv), r);
        _mm256_maskstore_ps(o + c, mask, _mm256_fmadd_ps(y, _mm256_maskload_ps(w + c, mask),
                                                         _mm256_maskload_ps(b + c, mask)));
    }
}

void strata_layernorm(float *out, const float *x, const float *w, const float *b,
                      int64_t rows, int64_t cols, float eps) {
    if (cols <= 0) return;
    if (rows < 2 || rows * cols < PAR_MIN_WORK) {
        for (int64_t r = 0; r < rows; r++) layernorm_row(out + r * cols, x + r * cols, w, b, cols, eps);
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; r++) layernorm_row(out + r * cols, x + r * cols, w, b, cols, eps);
    }
}
