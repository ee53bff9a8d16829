// strata-kernel: op=silu_mul dialect=c entry=strata_silu_mul requires=avx2,fma
// AVX2/FMA SwiGLU gate: out = a / (1 + exp(-a)) * b with a vectorised exp. exp's input is
// capped at 80 so the denominator stays finite: no NaN for a = -88 or below (result -> -0).
// Parallel chunks only when n is large enough to amortise an OpenMP team.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* Below this much work (elements, or multiply-adds for attention) the kernel stays on one
   thread: a fork-join costs microseconds on a quiet machine and milliseconds when the cores
   are shared (a descheduled worker stalls the join), so only ~1 ms+ of serial work forks.
   Override with -DPAR_MIN_WORK=... */
#ifndef PAR_MIN_WORK
#define PAR_MIN_WORK ((int64_t)(1 << 21))
#endif

/* Vectorised expf: Cephes range reduction (two-constant Cody-Waite) + degree-6 polynomial.
   Relative error ~2 ulp for x in [-87.3, 88.7]; below that results go denormal then 0,
   above it they overflow to +inf (never NaN). 2^n is applied as two factors so every
   n in [-150, 128] is representable. */
static inline __m256 exp256_ps(__m256 x) {
    x = _mm256_min_ps(x, _mm256_set1_ps(88.7228390f));
    x = _mm256_max_ps(x, _mm256_set1_ps(-104.0f));
    __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i n = _mm256_cvtps_epi32(fx);
    __m256i n1 = _mm256_srai_epi32(n, 1);
    __m256i n2 = _mm256_sub_epi32(n, n1);
    __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(y, p1), p2);
}

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
