// strata-kernel: op=attention dialect=c entry=strata_attention requires=avx2,fma
// AVX2/FMA causal prefill attention, q [H,T,D], k/v [Hkv,T,D], GQA (head h reads kv head
// h / (H/Hkv)). Per query row: q.k for 4 keys at a time (hadd reduction), max, vectorised
// exp, normalised probabilities, then P.V with register accumulators over D blocks.
// (h, t) rows run in parallel (dynamic schedule: causal rows differ in cost) for large work.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* Below this much work (elements, or multiply-adds for attention) the kernel stays on one
   thread: a fork-join costs microseconds on a quiet machine and milliseconds when the cores
   are shared (a descheduled worker stalls the join), so only ~1 ms+ of serial work forks.
   Override with -DPAR_MIN_WORK=... */
#ifndef PAR_MIN_WORK
#define PAR_MIN_WORK ((int64_t)(1 << 24))
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

static inline __m128 hsum4x8(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* p[s] = q . k[s] for s < n (unscaled). */
static void qk_scores(float *p, const float *q, const float *k, int64_t n, int64_t D) {
    int64_t D8 = D & ~(int64_t)7;
    __m256i dm = tailmask(D - D8);
    int64_t s = 0;
    for (; s + 4 <= n; s += 4) {
        const float *k0 = k + s * D, *k1 = k0 + D, *k2 = k1 + D, *k3 = k2 + D;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t d = 0;
        for (; d < D8; d += 8) {
            __m256 qv = _mm256_loadu_ps(q + d);
            a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
        }
        if (d < D) {
            __m256 qv = _mm256_maskload_ps(q + d, dm);
            a0 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(k0 + d, dm), a0);
            a1 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(k1 + d, dm), a1);
            a2 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(k2 + d, dm), a2);
            a3 = _mm256_fmadd_ps(qv, _mm256_maskload_ps(k3 + d, dm), a3);
        }
        _mm_storeu_ps(p + s, hsum4x8(a0, a1, a2, a3));
    }
    for (; s < n; s++) {
        const float *k0 = k + s * D;
        __m256 a0 = _mm256_setzero_ps();
        int64_t d = 0;
        for (; d < D8; d += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k0 + d), a0);
        if (d < D) a0 = _mm256_fmadd_ps(_mm256_maskload_ps(q + d, dm), _mm256_maskload_ps(k0 + d, dm), a0);
        p[s] = hsum256_ps(a0);
    }
}

/* p[0..n) <- softmax(p * scale) in place. */
static void softmax_scaled(float *p, int64_t n, float scale) {
    const __m256 sc = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    int64_t n8 = n & ~(int64_t)7;
    __m256i tm = tailmask(n - n8);
    __m256 mx = ninf;
    int64_t s = 0;
    for (; s < n8; s += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(p + s));
    if (s < n) mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_maskload_ps(p + s, tm), _mm256_castsi256_ps(tm)));
    float m = hmax256_ps(mx);
    /* scale > 0 assumed for the max; a negative scale flips it, handled by taking both ends */
    if (scale < 0) {
        __m256 mn = _mm256_set1_ps(INFINITY);
        for (s = 0; s < n8; s += 8) mn = _mm256_min_ps(mn, _mm256_loadu_ps(p + s));
        if (s < n) mn = _mm256_min_ps(mn, _mm256_blendv_ps(_mm256_set1_ps(INFINITY), _mm256_maskload_ps(p + s, tm), _mm256_castsi256_ps(tm)));
        __m128 t = _mm_min_ps(_mm256_castps256_ps128(mn), _mm256_extractf128_ps(mn, 1));
        t = _mm_min_ps(t, _mm_movehl_ps(t, t));
        t = _mm_min_ss(t, _mm_movehdup_ps(t));
        m = _mm_cvtss_f32(t);
    }
    const __m256 mv = _mm256_set1_ps(m * scale);
    __m256 sum = _mm256_setzero_ps();
    for (s = 0; s < n8; s += 8) {
        __m256 e = exp256_ps(_mm256_fmsub_ps(_mm256_loadu_ps(p + s), sc, mv));
        _mm256_storeu_ps(p + s, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (s < n) {
        __m256 e = _mm256_and_ps(exp256_ps(_mm256_fmsub_ps(_mm256_maskload_ps(p + s, tm), sc, mv)), _mm256_castsi256_ps(tm));
        _mm256_maskstore_ps(p + s, tm, e);
        sum = _mm256_add_ps(sum, e);
    }
    const __m256 inv = _mm256_set1_ps(1.0f / hsum256_ps(sum));
    for (s = 0; s < n8; s += 8) _mm256_storeu_ps(p + s, _mm256_mul_ps(_mm256_loadu_ps(p + s), inv));
    if (s < n) _mm256_maskstore_ps(p + s, tm, _mm256_mul_ps(_mm256_maskload_ps(p + s, tm), inv));
}

/* o[0..D) = sum_s p[s] v[s]. */
static void pv_accum(float *o, const float *p, const float *v, int64_t n, int64_t D) {
    int64_t d = 0;
    for (; d + 32 <= D; d += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t s = 0; s < n; s++) {
            const float *vr = v + s * D + d;
            __m256 pv = _mm256_broadcast_ss(p + s);
            a0 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vr), a0);
            a1 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vr + 8), a1);
            a2 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vr + 16), a2);
            a3 = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vr + 24), a3);
        }
        _mm256_storeu_ps(o + d, a0);
        _mm256_storeu_ps(o + d + 8, a1);
        _mm256_storeu_ps(o + d + 16, a2);
        _mm256_storeu_ps(o + d + 24, a3);
    }
    for (; d + 8 <= D; d += 8) {
        __m256 a0 = _mm256_setzero_ps();
        for (int64_t s = 0; s < n; s++)
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + s), _mm256_loadu_ps(v + s * D + d), a0);
        _mm256_storeu_ps(o + d, a0);
    }
    if (d < D) {
        __m256i dm = tailmask(D - d);
        __m256 a0 = _mm256_setzero_ps();
        for (int64_t s = 0; s < n; s++)
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(p + s), _mm256_maskload_ps(v + s * D + d, dm), a0);
        _mm256_maskstore_ps(o + d, dm, a0);
    }
}

static void attn_row(float *out, const float *q, const float *k, const float *v,
                     int64_t H, int64_t Hkv, int64_t T, int64_t D, float scale, int64_t r, float *p) {
    int64_t h = r / T, t = r % T, g = h / (H / Hkv);
    const float *kh = k + g * T * D, *vh = v + g * T * D;
    qk_scores(p, q + r * D, kh, t + 1, D);
    softmax_scaled(p, t + 1, scale);
    pv_accum(out + r * D, p, vh, t + 1, D);
}

void strata_attention(float *out, const float *q, const float *k, const float *v,
                      int64_t H, int64_t Hkv, int64_t T, int64_t D, float scale) {
    if (T <= 0 || D <= 0 || H <= 0) return;
    int64_t nrows = H * T;
    double work = (double)nrows * (double)(T + 1) * 0.5 * (double)D;
    if (nrows < 2 || work < (double)PAR_MIN_WORK) {
        float *p = (float *)malloc((size_t)T * sizeof(float));
        if (!p) return;
        for (int64_t r = 0; r < nrows; r++) attn_row(out, q, k, v, H, Hkv, T, D, scale, r, p);
        free(p);
    } else {
#pragma omp parallel
        {
            float *p = (float *)malloc((size_t)T * sizeof(float));
            /* rows are visited longest-first within each head block for better balance */
#pragma omp for schedule(dynamic, 4)
            for (int64_t i = 0; i < nrows; i++) {
                int64_t h = i / T, t = T - 1 - i % T;
                if (p) attn_row(out, q, k, v, H, Hkv, T, D, scale, h * T + t, p);
            }
            free(p);
        }
    }
}
