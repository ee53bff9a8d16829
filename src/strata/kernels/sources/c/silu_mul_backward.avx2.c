// strata-kernel: op=silu_mul_backward dialect=c entry=strata_silu_mul_backward requires=avx2,fma
// AVX2/FMA gradients of the SwiGLU gate silu(a)*b, out = [da (n) | db (n)]:
// e = exp(-a), s = 1/(1+e), silu = a*s, da = dy*b*s*(1 + a*e*s), db = dy*silu. exp's input is
// capped at 80 so 1+exp stays finite (a <= -80: s ~ 1e-35, both gradients ~0, never NaN).
// Elementwise: parallel chunks only when n is large enough to amortise an OpenMP team.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* Below this many elements the kernel stays on one thread: it streams 5 floats per element
   (memory-bound), a second core adds little bandwidth, and a fork-join costs milliseconds
   when the cores are shared (measured here: 2 threads slower than 1 at 3M elements on a busy
   2-core host). Override with -DPAR_MIN_WORK=... */
#ifndef PAR_MIN_WORK
#define PAR_MIN_WORK ((int64_t)(1 << 22))
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

/* Lane mask for the last (n % 8) elements: lanes [0, rem) active. */
static inline __m256i tailmask(int64_t rem) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)rem),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

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
