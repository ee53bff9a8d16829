// strata-kernel: op=attention_backward dialect=c entry=strata_attention_backward requires=avx2,fma
// AVX2/FMA causal GQA attention backward from the saved o and lse (flash-attention-2
// recomputation; no T x T matrix: two rows of T floats per thread). Per query row t of head
// h (kv head g = h / (H/Hkv)):
//   s_j = q_t.k_j and dp_j = dout_t.v_j for 4 keys at a time (hadd reduction),
//   p_j = exp(scale s_j - lse_t), ds_j = p_j (dp_j - delta_t), delta_t = dout_t.o_t,
//   dq_t = scale sum_j ds_j k_j (register accumulators over D blocks),
//   dk_j += scale ds_j q_t, dv_j += p_j dout_t (row updates).
// out = [dq (H*T*D) | dk (Hkv*T*D) | dv (Hkv*T*D)]. Threads split the kv heads: one thread
// owns kv head g's dk/dv rows and walks its whole query group in a fixed order, so the
// accumulation is race-free and bit-identical for every team size (no atomics, no
// reduction whose order depends on the schedule). K, V, dK, dV of one kv head stay in L2.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "strata_attention.h"

/* Below this many multiply-adds the kernel stays on one thread (~0.5 ms of serial work: a
   fork-join on shared cores can cost that much). Override with -DPAR_MIN_WORK=... */
#ifndef PAR_MIN_WORK
#define PAR_MIN_WORK ((int64_t)(1 << 21))
#endif

/* p <- exp(p*scale - lse); ds <- p * (ds - delta), for j < n. */
static void probs_and_ds(float *p, float *ds, int64_t n, float scale, float lse, float delta) {
    const __m256 sc = _mm256_set1_ps(scale), lv = _mm256_set1_ps(lse), dv = _mm256_set1_ps(delta);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        __m256 e = exp256_ps(_mm256_fmsub_ps(_mm256_loadu_ps(p + j), sc, lv));
        _mm256_storeu_ps(p + j, e);
        _mm256_storeu_ps(ds + j, _mm256_mul_ps(e, _mm256_sub_ps(_mm256_loadu_ps(ds + j), dv)));
    }
    if (j < n) {
        __m256i tm = tailmask(n - j);
        __m256 e = exp256_ps(_mm256_fmsub_ps(_mm256_maskload_ps(p + j, tm), sc, lv));
        _mm256_maskstore_ps(p + j, tm, e);
        _mm256_maskstore_ps(ds + j, tm, _mm256_mul_ps(e, _mm256_sub_ps(_mm256_maskload_ps(ds + j, tm), dv)));
    }
}

/* o[0..D) = c * sum_j w[j] m[j] (m rows of D floats). */
static void weighted_rows(float *o, const float *w, const float *m, int64_t n, int64_t D, float c) {
    const __m256 cv = _mm256_set1_ps(c);
    int64_t d = 0;
    for (; d + 32 <= D; d += 32) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t j = 0; j < n; j++) {
            const float *r = m + j * D + d;
            __m256 wv = _mm256_broadcast_ss(w + j);
            a0 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(r), a0);
            a1 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(r + 8), a1);
            a2 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(r + 16), a2);
            a3 = _mm256_fmadd_ps(wv, _mm256_loadu_ps(r + 24), a3);
        }
        _mm256_storeu_ps(o + d, _mm256_mul_ps(a0, cv));
        _mm256_storeu_ps(o + d + 8, _mm256_mul_ps(a1, cv));
        _mm256_storeu_ps(o + d + 16, _mm256_mul_ps(a2, cv));
        _mm256_storeu_ps(o + d + 24, _mm256_mul_ps(a3, cv));
    }
    for (; d + 8 <= D; d += 8) {
        __m256 a0 = _mm256_setzero_ps();
        for (int64_t j = 0; j < n; j++)
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(w + j), _mm256_loadu_ps(m + j * D + d), a0);
        _mm256_storeu_ps(o + d, _mm256_mul_ps(a0, cv));
    }
    if (d < D) {
        __m256i dm = tailmask(D - d);
        __m256 a0 = _mm256_setzero_ps();
        for (int64_t j = 0; j < n; j++)
            a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(w + j), _mm256_maskload_ps(m + j * D + d, dm), a0);
        _mm256_maskstore_ps(o + d, dm, _mm256_mul_ps(a0, cv));
    }
}

/* For j < n: dk[j] += a[j]*c * x, dv[j] += b[j] * y (rows of D floats). */
static void rank1_rows(float *dk, float *dv, const float *a, const float *b, float c,
                       const float *x, const float *y, int64_t n, int64_t D) {
    int64_t D8 = D & ~(int64_t)7;
    __m256i dm = tailmask(D - D8);
    for (int64_t j = 0; j < n; j++) {
        const __m256 av = _mm256_set1_ps(a[j] * c), bv = _mm256_set1_ps(b[j]);
        float *kr = dk + j * D, *vr = dv + j * D;
        int64_t d = 0;
        for (; d < D8; d += 8) {
            _mm256_storeu_ps(kr + d, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + d), _mm256_loadu_ps(kr + d)));
            _mm256_storeu_ps(vr + d, _mm256_fmadd_ps(bv, _mm256_loadu_ps(y + d), _mm256_loadu_ps(vr + d)));
        }
        if (d < D) {
            _mm256_maskstore_ps(kr + d, dm, _mm256_fmadd_ps(av, _mm256_maskload_ps(x + d, dm), _mm256_maskload_ps(kr + d, dm)));
            _mm256_maskstore_ps(vr + d, dm, _mm256_fmadd_ps(bv, _mm256_maskload_ps(y + d, dm), _mm256_maskload_ps(vr + d, dm)));
        }
    }
}

static float dot(const float *a, const float *b, int64_t D) {
    __m256 acc = _mm256_setzero_ps();
    int64_t d = 0;
    for (; d + 8 <= D; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), _mm256_loadu_ps(b + d), acc);
    if (d < D) {
        __m256i dm = tailmask(D - d);
        acc = _mm256_fmadd_ps(_mm256_maskload_ps(a + d, dm), _mm256_maskload_ps(b + d, dm), acc);
    }
    return hsum256_ps(acc);
}

/* Every gradient that kv head g owns or feeds: dq of its query heads, its dk and dv rows. */
static void kv_head(float *out, const float *q, const float *k, const float *v, const float *o,
                    const float *lse, const float *dout, int64_t H, int64_t Hkv, int64_t T,
                    int64_t D, float scale, int64_t g, float *p, float *ds) {
    int64_t group = H / Hkv;
    const float *kh = k + g * T * D, *vh = v + g * T * D;
    float *dk = out + H * T * D + g * T * D, *dv = out + H * T * D + Hkv * T * D + g * T * D;
    memset(dk, 0, (size_t)(T * D) * sizeof(float));
    memset(dv, 0, (size_t)(T * D) * sizeof(float));
    for (int64_t h = g * group; h < (g + 1) * group; h++) {
        for (int64_t t = 0; t < T; t++) {
            int64_t r = h * T + t;
            const float *qr = q + r * D, *dr = dout + r * D;
            qk_scores(p, qr, kh, t + 1, D);
            qk_scores(ds, dr, vh, t + 1, D);
            probs_and_ds(p, ds, t + 1, scale, lse[r], dot(dr, o + r * D, D));
            weighted_rows(out + r * D, ds, kh, t + 1, D, scale);
            rank1_rows(dk, dv, ds, p, scale, qr, dr, t + 1, D);
        }
    }
}

void strata_attention_backward(float *out, const float *q, const float *k, const float *v,
                               const float *o, const float *lse, const float *dout,
                               int64_t H, int64_t Hkv, int64_t T, int64_t D, float scale) {
    if (T <= 0 || D <= 0 || H <= 0) return;
    double work = (double)H * (double)T * (double)(T + 1) * 0.5 * (double)D * 5.0;
    int par = Hkv > 1 && work >= (double)PAR_MIN_WORK;
#pragma omp parallel if (par)
    {
        float *p = (float *)malloc((size_t)T * sizeof(float));
        float *ds = (float *)malloc((size_t)T * sizeof(float));
#pragma omp for schedule(dynamic, 1)
        for (int64_t g = 0; g < Hkv; g++)
            if (p && ds) kv_head(out, q, k, v, o, lse, dout, H, Hkv, T, D, scale, g, p, ds);
        free(p);
        free(ds);
    }
}
