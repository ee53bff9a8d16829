// strata-kernel: op=swiglu_oai dialect=c entry=strata_swiglu_oai requires=avx2,fma
// AVX2/FMA gpt-oss gate: x = min(a, 7), y = clamp(b, -7, 7), out = x / (1 + e^(-1.702 x)) *
// (y + 1), ggml's float32 formula with a vectorised exp (~2 ulp). The exp overflows to +inf
// for a << 0 (x / inf = -0, never NaN). min/max take the limit as their first operand so a NaN
// input stays NaN, as ggml's std::min / std::clamp. Parallel chunks only for large n.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "strata_simd.h"

#ifndef PAR_MIN_WORK
#define PAR_MIN_WORK ((int64_t)(1 << 21))
#endif

static inline __m256 swiglu_oai8(__m256 a, __m256 b) {
    const __m256 limit = _mm256_set1_ps(7.0f), one = _mm256_set1_ps(1.0f);
    __m256 x = _mm256_min_ps(limit, a);
    __m256 y = _mm256_min_ps(limit, _mm256_max_ps(_mm256_set1_ps(-7.0f), b));
    __m256 e = exp256_ps(_mm256_mul_ps(_mm256_set1_ps(-1.702f), x));
    return _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_add_ps(y, one));
}

static void swiglu_oai_span(float *out, const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_ps(out + i, swiglu_oai8(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
        _mm256_storeu_ps(out + i + 8, swiglu_oai8(_mm256_loadu_ps(a + i + 8),
                                                  _mm256_loadu_ps(b + i + 8)));
    }
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, swiglu_oai8(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    if (i < n) {
        __m256i mask = tailmask(n - i);
        _mm256_maskstore_ps(out + i, mask, swiglu_oai8(_mm256_maskload_ps(a + i, mask),
                                                       _mm256_maskload_ps(b + i, mask)));
    }
}

void strata_swiglu_oai(float *out, const float *a, const float *b, int64_t n) {
    if (n <= 0) return;
    if (n < PAR_MIN_WORK) {
        swiglu_oai_span(out, a, b, n);
        return;
    }
    const int64_t chunk = 8192, nchunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < nchunks; k++) {
        int64_t s = k * chunk, len = n - s < chunk ? n - s : chunk;
        swiglu_oai_span(out + s, a + s, b + s, len);
    }
}
