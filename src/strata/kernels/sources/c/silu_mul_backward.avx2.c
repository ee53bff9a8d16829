// strata-kernel: op=silu_mul_backward dialect=c entry=strata_silu_mul_backward requires=avx2,fma
// AVX2/FMA gradients of the SwiGLU gate silu(a)*b, out = [da (n) | db (n)]:
// e = exp(-a), s = 1/(1+e), silu = a*s, da = dy*b*s*(1 + a*e*s), db = dy*silu. exp's input is
// capped at 80 so 1+exp stays finite (a <= -80: s ~ 1e-35, both gradients ~0, never NaN).
// Elementwise: parallel chunks only when n is large enough to amortise an OpenMP team.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "strata_simd.h"

/* Below this many elements the kernel stays on one thread: it streams 5 floats per element
   (memory-bound), a second core adds little bandwidth, and a fork-join costs milliseconds
   when the cores are shared (measured here: 2 threads slower than 1 at 3M elements on a busy
   2-core host). Override with -DPAR_MIN_WORK=... */
#ifndef PAR_MIN_WORK
#define PAR_MIN_WORK ((int64_t)(1 << 22))
#endif

static inline void grads8(float *da, float *db, const float *a, const float *b,
                          const float *dy, __m256i m, int masked) {
    __m256 av = masked ? _mm256_maskload_ps(a, m) : _mm256_loadu_ps(a);
    __m256 bv = masked ? _mm256_maskload_ps(b, m) : _mm256_loadu_ps(b);
    __m256 gv = masked ? _mm256_maskload_ps(dy, m) : _mm256_loadu_ps(dy);
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 e = exp256_ps(_mm256_min_ps(_mm256_sub_ps(_mm256_setzero_ps(), av), _mm256_set1_ps(80.0f)));
    __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, e));
    __m256 silu = _mm256_mul_ps(av, s);
    /* s*(1 + a*(1-s)) with 1-s = e*s: no cancellation. (s + silu - silu*s lost up to half
       an ulp of silu: 3e-5 relative at a = 511, found by a benchmark's mixed inputs.) */
    __m256 ds = _mm256_mul_ps(s, _mm256_fmadd_ps(av, _mm256_mul_ps(e, s), one));
    __m256 gda = _mm256_mul_ps(_mm256_mul_ps(gv, bv), ds), gdb = _mm256_mul_ps(gv, silu);
    if (masked) {
        _mm256_maskstore_ps(da, m, gda);
        _mm256_maskstore_ps(db, m, gdb);
    } else {
        _mm256_storeu_ps(da, gda);
        _mm256_storeu_ps(db, gdb);
    }
}

static void span(float *da, float *db, const float *a, const float *b, const float *dy,
                 int64_t n) {
    const __m256i all = _mm256_set1_epi32(-1);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) grads8(da + i, db + i, a + i, b + i, dy + i, all, 0);
    if (i < n) grads8(da + i, db + i, a + i, b + i, dy + i, tailmask(n - i), 1);
}

void strata_silu_mul_backward(float *out, const float *a, const float *b, const float *dy,
                              int64_t n) {
    if (n <= 0) return;
    float *da = out, *db = out + n;
    if (n < PAR_MIN_WORK) {
        span(da, db, a, b, dy, n);
        return;
    }
    const int64_t chunk = 8192;
    int64_t nchunks = (n + chunk - 1) / chunk;
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < nchunks; k++) {
        int64_t s = k * chunk, len = n - s < chunk ? n - s : chunk;
        span(da + s, db + s, a + s, b + s, dy + s, len);
    }
}
