// strata-kernel: op=gelu_mul dialect=c entry=strata_gelu_mul requires=avx2,fma,f16c
// AVX2/FMA/F16C GeGLU gate with ggml's CPU GELU: a rounded to fp16 (vcvtps2ph, nearest even),
// the tanh GELU of it in float32 with tanh(u) = 1 - 2 / (1 + e^(2u)) (vectorised exp, u
// capped at ±40 where tanh is ±1 in float32), rounded to fp16, times b; a <= -10 gives 0 and
// a >= 10 gives a, as ggml's branches do. Parallel chunks only for large n.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "strata_simd.h"

#ifndef PAR_MIN_WORK
#define PAR_MIN_WORK ((int64_t)(1 << 20))
#endif

static inline __m256 round_half8(__m256 x) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

static inline __m256 gelu_mul8(__m256 a, __m256 b) {
    const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
    __m256 x = round_half8(_mm256_min_ps(_mm256_max_ps(a, lo), hi));
    __m256 u = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.79788456080286535588f), x),
                             _mm256_fmadd_ps(_mm256_mul_ps(x, x), _mm256_set1_ps(0.044715f),
                                             _mm256_set1_ps(1.0f)));
    u = _mm256_min_ps(_mm256_max_ps(u, _mm256_set1_ps(-40.0f)), _mm256_set1_ps(40.0f));
    __m256 e = exp256_ps(_mm256_add_ps(u, u));
    __m256 th = _mm256_sub_ps(_mm256_set1_ps(1.0f),
                              _mm256_div_ps(_mm256_set1_ps(2.0f),
                                            _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
    __m256 g = round_half8(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x),
                                         _mm256_add_ps(_mm256_set1_ps(1.0f), th)));
    g = _mm256_blendv_ps(g, a, _mm256_cmp_ps(a, hi, _CMP_GE_OQ));
    g = _mm256_blendv_ps(g, _mm256_setzero_ps(), _mm256_cmp_ps(a, lo, _CMP_LE_OQ));
    return _mm256_mul_ps(g, b);
}

static void gelu_mul_span(float *out, const float *a, const float *b, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, gelu_mul8(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
    if (i < n) {
        __m256i mask = tailmask(n - i);
        _mm256_maskstore_ps(out + i, mask, gelu_mul8(_mm256_maskload_ps(a + i, mask),
                                                     _mm256_maskload_ps(b + i, mask)));
    }
}

void strata_gelu_mul(float *out, const float *a, const float *b, int64_t n) {
    if (n <= 0) return;
    if (n < PAR_MIN_WORK) {
        gelu_mul_span(out, a, b, n);
        return;
    }
    const int64_t chunk = 8192, nchunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < nchunks; k++) {
        int64_t s = k * chunk, len = n - s < chunk ? n - s : chunk;
        gelu_mul_span(out + s, a + s, b + s, len);
    }
}
