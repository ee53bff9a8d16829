// strata-kernel: op=rope_backward dialect=c entry=strata_rope_backward requires=avx2,fma
// AVX2/FMA gradient of rotate-half RoPE (dy [T,H,D], cos/sin [T,D/2]): the inverse rotation,
// dx[i] = dy[i]*c + dy[i+D/2]*s, dx[i+D/2] = dy[i+D/2]*c - dy[i]*s. Rows (t, h) in parallel
// only for large work. Odd D (not meaningful for RoPE) passes the last element through.
#include <immintrin.h>
#include <stdint.h>
#include "strata_simd.h"

/* Below this many elements the kernel stays on one thread: a fork-join costs microseconds
   on a quiet machine and milliseconds when the cores are shared, so only ~1 ms+ of serial
   work forks. Override with -DPAR_MIN_WORK=... */
#ifndef PAR_MIN_WORK
#define PAR_MIN_WORK ((int64_t)(1 << 22))
#endif

static void unrope_row(float *o, const float *g, const float *c, const float *s, int64_t half) {
    int64_t i = 0;
    for (; i + 8 <= half; i += 8) {
        __m256 g1 = _mm256_loadu_ps(g + i), g2 = _mm256_loadu_ps(g + i + half);
        __m256 cv = _mm256_loadu_ps(c + i), sv = _mm256_loadu_ps(s + i);
        _mm256_storeu_ps(o + i, _mm256_fmadd_ps(g1, cv, _mm256_mul_ps(g2, sv)));
        _mm256_storeu_ps(o + i + half, _mm256_fmsub_ps(g2, cv, _mm256_mul_ps(g1, sv)));
    }
    if (i < half) {
        __m256i m = tailmask(half - i);
        __m256 g1 = _mm256_maskload_ps(g + i, m), g2 = _mm256_maskload_ps(g + i + half, m);
        __m256 cv = _mm256_maskload_ps(c + i, m), sv = _mm256_maskload_ps(s + i, m);
        _mm256_maskstore_ps(o + i, m, _mm256_fmadd_ps(g1, cv, _mm256_mul_ps(g2, sv)));
        _mm256_maskstore_ps(o + i + half, m, _mm256_fmsub_ps(g2, cv, _mm256_mul_ps(g1, sv)));
    }
}

static void rows(float *out, const float *dy, const float *cos, const float *sin,
                 int64_t r, int64_t H, int64_t D) {
    int64_t half = D / 2, t = r / H;
    unrope_row(out + r * D, dy + r * D, cos + t * half, sin + t * half, half);
    if (D & 1) out[r * D + D - 1] = dy[r * D + D - 1];
}

void strata_rope_backward(float *out, const float *dy, const float *cos, const float *sin,
                          int64_t T, int64_t H, int64_t D) {
    int64_t n = T * H;
    if (n <= 0 || D <= 0) return;
    int par = n >= 2 && n * D >= PAR_MIN_WORK;
#pragma omp parallel for schedule(static) if (par)
    for (int64_t r = 0; r < n; r++) rows(out, dy, cos, sin, r, H, D);
}
