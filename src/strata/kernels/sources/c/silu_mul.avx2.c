// strata-kernel: op=silu_mul dialect=c entry=strata_silu_mul requires=avx2,fma
// AVX2/FMA SwiGLU gate: out = a / (1 + exp(-a)) * b with a vectorised exp. exp's input is
// capped at 80 so the denominator stays finite: no NaN for a = -88 or below (result -> -0).
// Parallel chunks only when n is large enough to amortise an OpenMP team.
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
#define PAR_MIN_WORK ((int64_t)(1 << 21))
#endif

static inline __m256 silu_mul8(__m256 a, __m256 b) {
    __m256 e = exp256_ps(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), a), _mm256_set1_ps(80.0f)));
    return _mm256_mul_ps(_mm256_div_ps(a, _mm256_add_ps(e, _mm256_set1_ps(1.0f))), b);
}

static void silu_mul_span(float *out, const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_ps(out + i, silu_mul8(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
        _mm256_storeu_ps(out + i + 8, silu_mul8(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8)));
    }
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, silu_mul8(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    if (i < n) {
        __m256i mask = tailmask(n - i);
        _mm256_maskstore_ps(out + i, mask, silu_mul8(_mm256_maskload_ps(a + i, mask),
                                                     _mm256_maskload_ps(b + i, mask)));
    }
}

void strata_silu_mul(float *out, const float *a, const float *b, int64_t n) {
    if (n <= 0) return;
    if (n < PAR_MIN_WORK) {
        silu_mul_span(out, a, b, n);
    } else {
        const int64_t chunk = 8192;
        int64_t nchunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < nchunks; k++) {
            int64_t s = k * chunk, len = n - s < chunk ? n - s : chunk;
            silu_mul_span(out + s, a + s, b + s, len);
        }
    }
}
