// strata-kernel: op=rope dialect=c entry=strata_rope requires=avx2,fma
// AVX2/FMA rotate-half RoPE over x [T,H,D] with cos/sin [T,D/2]; rows in parallel only for
// large work. Odd D (not meaningful for RoPE) passes the last element through.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* Below this much work (elements, or multiply-adds for attention) the kernel stays on one
   thread: a fork-join costs microseconds on a quiet machine and milliseconds when the cores
   are shared (a descheduled worker stalls the join), so only ~1 ms+ of serial work forks.
   Override with -DPAR_MIN_WORK=... */
#ifndef PAR_MIN_WORK
#define PAR_MIN_WORK ((int64_t)(1 << 22))
#endif

static inline float hsum256_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float hmax256_ps(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Lane mask for the last (n % 8) elements: lanes [0, rem) active. */
static inline __m256i tailmask(int64_t rem) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)rem),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

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
