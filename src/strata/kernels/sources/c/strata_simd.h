/* strata_simd.h: the AVX2/FMA helpers the built-in `c` kernels share (docs/kernels-abi.md,
 * "Shared headers"). A kernel includes it by name, `#include "strata_simd.h"`; the bytes of
 * every shared header a source includes are part of its content hash, so editing this file
 * re-verifies each kernel that uses it. Everything here is `static inline`: each kernel's
 * library keeps its own copy, nothing is exported. */
#ifndef STRATA_SIMD_H
#define STRATA_SIMD_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

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

/* Horizontal sum of the 8 lanes (pairwise: lanes i and i+4, then i and i+2, then 0 and 1). */
static inline float hsum256_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Horizontal max of the 8 lanes. */
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

/* The four horizontal sums of a0..a3 in lanes 0..3 (hadd tree). */
static inline __m128 hsum4x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* The fp16 value at p (a GGUF block scale), as float32 in all 8 lanes (F16C: exact,
   subnormals included). */
static inline __m256 half_at(const uint8_t *p) {
    int16_t h;
    memcpy(&h, p, sizeof h);  /* one 16-bit load, broadcast: vpbroadcastw + vcvtph2ps */
    return _mm256_cvtph_ps(_mm_set1_epi16(h));
}

/* One 32-block of x rounded as ggml's AVX2 quantize_row_q8_0 rounds it (needs F16C):
 * returns amax = max |x|; *d = fp16(amax / 127) as float32 (round to nearest even);
 * i[j] = round_half_even(x[8j..8j+7] * (127 / amax)) as int32 (0 when amax is 0). */
static inline float q8_round_block(const float *x, __m256i i[4], float *d) {
    const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
    const __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1));
    m = _mm256_max_ps(m, _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    __m128 m4 = _mm_max_ps(_mm256_extractf128_ps(m, 1), _mm256_castps256_ps128(m));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));  /* ggml's order (a NaN lane is dropped) */
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const __m128i h = _mm_cvtps_ph(_mm_set_ss(amax / 127.0f), _MM_FROUND_TO_NEAREST_INT);
    *d = _mm_cvtss_f32(_mm_cvtph_ps(h));
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    const int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;  /* half to even */
    i[0] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, id), mode));
    i[1] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, id), mode));
    i[2] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, id), mode));
    i[3] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, id), mode));
    return amax;
}

#endif /* STRATA_SIMD_H */
