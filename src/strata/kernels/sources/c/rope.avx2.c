// strata-kernel: op=rope dialect=c entry=strata_rope requires=avx2,fma
// AVX2/FMA rotate-half RoPE over x [T,H,D] with cos/sin [T,D/2]; rows in parallel only for
// large work. Odd D (not meaningful for RoPE) passes the last element through.
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

static void rope_row(float *o, const float *x, const float *c, const float *s, int64_t half) {
    int64_t i = 0;
    for (; i + 8 <= half; i += 8) {
        __m256 x1 = _mm256_loadu_ps(x + i), x2 = _mm256_loadu_ps(x + i + half);
        __m256 cv = _mm256_loadu_ps(c + i), sv = _mm256_loadu_ps(s + i);
        _mm256_storeu_ps(o + i, _mm256_fmsub_ps(x1, cv, _mm256_mul_ps(x2, sv)));
        _mm256_storeu_ps(o + i + half, _mm256_fmadd_ps(x2, cv, _mm256_mul_ps(x1, sv)));
    }
    if (i < half) {
        __m256i m = tailmask(half - i);
        __m256 x1 = _mm256_maskload_ps(x + i, m), x2 = _mm256_maskload_ps(x + i + half, m);
        __m256 cv = _mm256_maskload_ps(c + i, m), sv = _mm256_maskload_ps(s + i, m);
        _mm256_maskstore_ps(o + i, m, _mm256_fmsub_ps(x1, cv, _mm256_mul_ps(x2, sv)));
        _mm256_maskstore_ps(o + i + half, m, _mm256_fmadd_ps(x2, cv, _mm256_mul_ps(x1, sv)));
    }
}

void strata_rope(float *out, const float *x, const float *cos, const float *sin,
                 int64_t T, int64_t H, int64_t D) {
    int64_t half = D / 2, n = T * H;
    if (n <= 0 || D <= 0) return;
    if (n < 2 || n * D < PAR_MIN_WORK) {
        for (int64_t r = 0; r < n; r++) {
            int64_t t = r / H;
            rope_row(out + r * D, x + r * D, cos + t * half, sin + t * half, half);
            if (D & 1) out[r * D + D - 1] = x[r * D + D - 1];
        }
    } else {
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < n; r++) {
            int64_t t = r / H;
            rope_row(out + r * D, x + r * D, cos + t * half, sin + t * half, half);
            if (D & 1) out[r * D + D - 1] = x[r * D + D - 1];
        }
    }
}
