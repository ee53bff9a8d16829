// strata-kernel: op=rmsnorm dialect=c entry=strata_rmsnorm requires=avx2,fma
// AVX2/FMA RMSNorm: one sum-of-squares pass (4 accumulators) and one fused scale pass.
// Rows run in parallel only when the total work amortises an OpenMP team.
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

static void rmsnorm_row(float *o, const float *x, const float *w, int64_t C, float eps) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int64_t c = 0;
    for (; c + 32 <= C; c += 32) {
        __m256 x0 = _mm256_loadu_ps(x + c), x1 = _mm256_loadu_ps(x + c + 8);
        __m256 x2 = _mm256_loadu_ps(x + c + 16), x3 = _mm256_loadu_ps(x + c + 24);
        a0 = _mm256_fmadd_ps(x0, x0, a0);
        a1 = _mm256_fmadd_ps(x1, x1, a1);
        a2 = _mm256_fmadd_ps(x2, x2, a2);
        a3 = _mm256_fmadd_ps(x3, x3, a3);
    }
    for (; c + 8 <= C; c += 8) { __m256 x0 = _mm256_loadu_ps(x + c); a0 = _mm256_fmadd_ps(x0, x0, a0); }
    int64_t rem = C - c;
    __m256i mask = tailmask(rem);
    if (rem) { __m256 x0 = _mm256_maskload_ps(x + c, mask); a1 = _mm256_fmadd_ps(x0, x0, a1); }
    double ss = hsum256_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    const __m256 r = _mm256_set1_ps((float)(1.0 / sqrt(ss / (double)C + (double)eps)));
    c = 0;
    for (; c + 16 <= C; c += 16) {
        _mm256_storeu_ps(o + c, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + c), r), _mm256_loadu_ps(w + c)));
        _mm256_storeu_ps(o + c + 8, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + c + 8), r), _mm256_loadu_ps(w + c + 8)));
    }
    for (; c + 8 <= C; c += 8)
        _mm256_storeu_ps(o + c, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + c), r), _mm256_loadu_ps(w + c)));
    if (rem)
        _mm256_maskstore_ps(o + c, mask, _mm256_mul_ps(_mm256_mul_ps(_mm256_maskload_ps(x + c, mask), r),
                                                       _mm256_maskload_ps(w + c, mask)));
}

void strata_rmsnorm(float *out, const float *x, const float *w, int64_t rows, int64_t cols,
                    float eps) {
    if (cols <= 0) return;
    if (rows < 2 || rows * cols < PAR_MIN_WORK) {
        for (int64_t r = 0; r < rows; r++) rmsnorm_row(out + r * cols, x + r * cols, w, cols, eps);
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < rows; r++) rmsnorm_row(out + r * cols, x + r * cols, w, cols, eps);
    }
}
