// strata-kernel: op=attention_lse dialect=c entry=strata_attention_lse requires=avx2,fma
// AVX2/FMA causal GQA attention that also returns each query's logsumexp (the training
// forward): out = [o (H*T*D) | lse (H*T)], q [H,T,D], k/v [Hkv,T,D], head h reads kv head
// h / (H/Hkv). Per query row: q.k for 4 keys at a time (hadd reduction), max, vectorised
// exp, lse = scale*max + log(sum), normalised probabilities, then P.V with register
// accumulators over D blocks. Rows are independent, so (h, t) rows run in parallel
// (dynamic schedule: causal rows differ in cost) and the result never depends on the team.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

/* Below this many multiply-adds the kernel stays on one thread (~0.5 ms of serial work: a
   fork-join on shared cores can cost that much). Override with -DPAR_MIN_WORK=... */
#ifndef PAR_MIN_WORK
#define PAR_MIN_WORK ((int64_t)(1 << 20))
#endif

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
/* p[0..n) <- softmax(p * scale) in place; returns logsumexp(p * scale). */
static float softmax_lse(float *p, int64_t n, float scale) {
    const __m256 sc = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    int64_t n8 = n & ~(int64_t)7;
    __m256i tm = tailmask(n - n8);
    /* the max of p*scale: of p*scale directly, so a negative scale needs no special case */
    __m256 mx = ninf;
    int64_t s = 0;
    for (; s < n8; s += 8) mx = _mm256_max_ps(mx, _mm256_mul_ps(_mm256_loadu_ps(p + s), sc));
    if (s < n) mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_mul_ps(_mm256_maskload_ps(p + s, tm), sc), _mm256_castsi256_ps(tm)));
    float m = hmax256_ps(mx);
    const __m256 mv = _mm256_set1_ps(m);
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
    float total = hsum256_ps(sum);
    const __m256 inv = _mm256_set1_ps(1.0f / total);
    for (s = 0; s < n8; s += 8) _mm256_storeu_ps(p + s, _mm256_mul_ps(_mm256_loadu_ps(p + s), inv));
    if (s < n) _mm256_maskstore_ps(p + s, tm, _mm256_mul_ps(_mm256_maskload_ps(p + s, tm), inv));
    return m + logf(total);
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
    out[H * T * D + r] = softmax_lse(p, t + 1, scale);
    pv_accum(out + r * D, p, vh, t + 1, D);
}

void strata_attention_lse(float *out, const float *q, const float *k, const float *v,
                          int64_t H, int64_t Hkv, int64_t T, int64_t D, float scale) {
    if (T <= 0 || D <= 0 || H <= 0) return;
    int64_t nrows = H * T;
    double work = (double)nrows * (double)(T + 1) * (double)D;  /* q.k and p.v, causal half */
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
