/* strata_attention.h: the attention building blocks the built-in `c` attention kernels
 * share (attention, attention_lse, attention_backward: q.k scores and P.V rows; decode_attention
 * attention_cached, attention_window and attention_sinks: the flash-decoding quad and its
 * driver, with an optional sink logit per query head; the *_f16 and *_q8_0 ones, the same
 * over a float16 or q8_0 cache: STRATA_KV_HALF, STRATA_KV_Q8_0). Hashed with each user like
 * strata_simd.h.
 * The functions are `static` (not inline: the compiler decides, as it did when each kernel
 * held its own copy); a kernel that leaves one unused gets no code for it. */
#ifndef STRATA_ATTENTION_H
#define STRATA_ATTENTION_H

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "strata_simd.h"

#define STRATA_UNUSED __attribute__((unused))

/* The K/V cache's rows for the flash-decoding quad and its driver (decode_quad_sinks,
   cached_item, cached_attention_sinks): a row of D values is KV_ROW(D) kv_t elements, and
   KV_LOAD(row, d) gives values d..d+7 of a row as floats (KV_MASKLOAD the first n < 8 of
   them, zeros after). float by default; IEEE binary16 (uint16_t, converted with F16C) where
   the including kernel defines STRATA_KV_HALF first (the *_f16 kernels); GGUF q8_0 blocks
   along D (34 bytes per 32 values: an fp16 scale, 32 int8; D a multiple of 32, so 8 values
   from a multiple of 8 never straddle a block) under STRATA_KV_Q8_0 (the *_q8_0 kernels).
   Queries, scores and sums stay float. */
#if defined(STRATA_KV_HALF)
typedef uint16_t kv_t;
#define KV_ROW(D) (D)
#define KV_LOAD(r, d) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((r) + (d))))
static inline __m256 kv_load_tail(const kv_t *p, int64_t n) {
    uint16_t h[8] = {0};
    for (int64_t i = 0; i < n; i++) h[i] = p[i];
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
}
#define KV_MASKLOAD(r, d, m, n) kv_load_tail((r) + (d), (n))
#elif defined(STRATA_KV_Q8_0)
typedef uint8_t kv_t;
#define KV_ROW(D) ((D) / 32 * 34)
static inline float kv_q8_scale(const kv_t *b) {
    uint16_t h;
    memcpy(&h, b, 2);
    return _cvtsh_ss(h);
}
static inline __m256 kv_q8_load(const kv_t *r, int64_t d) {
    const kv_t *b = r + (d >> 5) * 34;
    const __m128i q = _mm_loadl_epi64((const __m128i *)(b + 2 + (d & 31)));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)),
                         _mm256_set1_ps(kv_q8_scale(b)));
}
static inline __m256 kv_q8_tail(const kv_t *r, int64_t d, int64_t n) {
    float f[8] = {0};
    for (int64_t i = 0; i < n; i++) {
        const kv_t *b = r + ((d + i) >> 5) * 34;
        f[i] = kv_q8_scale(b) * (float)(int8_t)b[2 + ((d + i) & 31)];
    }
    return _mm256_loadu_ps(f);
}
#define KV_LOAD(r, d) kv_q8_load((r), (d))
#define KV_MASKLOAD(r, d, m, n) kv_q8_tail((r), (d), (n))
#else
typedef float kv_t;
#define KV_ROW(D) (D)
#define KV_LOAD(r, d) _mm256_loadu_ps((r) + (d))
#define KV_MASKLOAD(r, d, m, n) _mm256_maskload_ps((r) + (d), (m))
#endif

/* p[s] = q . k[s] for s < n (unscaled). */
static STRATA_UNUSED void qk_scores(float *p, const float *q, const float *k, int64_t n, int64_t D) {
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

/* o[0..D) = sum_s p[s] v[s]. */
static STRATA_UNUSED void pv_accum(float *o, const float *p, const float *v, int64_t n, int64_t D) {
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

#define DEC_BS 32  /* keys per online-softmax block of decode_quad */

/* One work item: queries q0..q3 (may repeat for padding) against one kv head.
   acc is scratch [4][D]; results for the first nq queries go to o[j]. sink: NULL, or each
   query's sink logit (gpt-oss): after the keys it joins the running max and the sum, not the
   values and unscaled, as ggml's flash_attn_ext with sinks (a sink of -inf adds nothing). */
static STRATA_UNUSED void decode_quad_sinks(float *const o[4], const float *const qp[4],
                                            const kv_t *kh, const kv_t *vh, int64_t S,
                                            int64_t D, float scale, int nq, float *acc,
                                            const float *sink) {
    float sc[DEC_BS * 4] __attribute__((aligned(32)));  /* layout [s][j] */
    const int64_t D8 = D & ~(int64_t)7, R = KV_ROW(D);  /* R: a cache row's kv_t */
    const __m256i dm = tailmask(D - D8);
    const __m128 scv = _mm_set1_ps(scale);
    __m128 mrun = _mm_set1_ps(-INFINITY), lrun = _mm_setzero_ps();
    for (int64_t i = 0; i < 4 * D; i++) acc[i] = 0.0f;
    const float *q0 = qp[0], *q1 = qp[1], *q2 = qp[2], *q3 = qp[3];

    for (int64_t s0 = 0; s0 < S; s0 += DEC_BS) {
        int64_t n = S - s0 < DEC_BS ? S - s0 : DEC_BS;
        const kv_t *kb = kh + s0 * R, *vb = vh + s0 * R;
        /* scores for this block */
        int64_t s = 0;
        for (; s + 2 <= n; s += 2) {
            const kv_t *ka = kb + s * R, *kc = ka + R;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            __m256 b0 = a0, b1 = a0, b2 = a0, b3 = a0;
            int64_t d = 0;
            for (; d < D8; d += 8) {
                __m256 x = KV_LOAD(ka, d), y = KV_LOAD(kc, d);
                __m256 v0 = _mm256_loadu_ps(q0 + d), v1 = _mm256_loadu_ps(q1 + d);
                a0 = _mm256_fmadd_ps(v0, x, a0); b0 = _mm256_fmadd_ps(v0, y, b0);
                a1 = _mm256_fmadd_ps(v1, x, a1); b1 = _mm256_fmadd_ps(v1, y, b1);
                __m256 v2 = _mm256_loadu_ps(q2 + d), v3 = _mm256_loadu_ps(q3 + d);
                a2 = _mm256_fmadd_ps(v2, x, a2); b2 = _mm256_fmadd_ps(v2, y, b2);
                a3 = _mm256_fmadd_ps(v3, x, a3); b3 = _mm256_fmadd_ps(v3, y, b3);
            }
            if (d < D) {
                __m256 x = KV_MASKLOAD(ka, d, dm, D - D8), y = KV_MASKLOAD(kc, d, dm, D - D8);
                __m256 v0 = _mm256_maskload_ps(q0 + d, dm), v1 = _mm256_maskload_ps(q1 + d, dm);
                a0 = _mm256_fmadd_ps(v0, x, a0); b0 = _mm256_fmadd_ps(v0, y, b0);
                a1 = _mm256_fmadd_ps(v1, x, a1); b1 = _mm256_fmadd_ps(v1, y, b1);
                __m256 v2 = _mm256_maskload_ps(q2 + d, dm), v3 = _mm256_maskload_ps(q3 + d, dm);
                a2 = _mm256_fmadd_ps(v2, x, a2); b2 = _mm256_fmadd_ps(v2, y, b2);
                a3 = _mm256_fmadd_ps(v3, x, a3); b3 = _mm256_fmadd_ps(v3, y, b3);
            }
            _mm_store_ps(sc + s * 4, _mm_mul_ps(hsum4x8(a0, a1, a2, a3), scv));
            _mm_store_ps(sc + s * 4 + 4, _mm_mul_ps(hsum4x8(b0, b1, b2, b3), scv));
        }
        if (s < n) {
            const kv_t *ka = kb + s * R;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            int64_t d = 0;
            for (; d < D8; d += 8) {
                __m256 x = KV_LOAD(ka, d);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q0 + d), x, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q1 + d), x, a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q2 + d), x, a2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q3 + d), x, a3);
            }
            if (d < D) {
                __m256 x = KV_MASKLOAD(ka, d, dm, D - D8);
                a0 = _mm256_fmadd_ps(_mm256_maskload_ps(q0 + d, dm), x, a0);
                a1 = _mm256_fmadd_ps(_mm256_maskload_ps(q1 + d, dm), x, a1);
                a2 = _mm256_fmadd_ps(_mm256_maskload_ps(q2 + d, dm), x, a2);
                a3 = _mm256_fmadd_ps(_mm256_maskload_ps(q3 + d, dm), x, a3);
            }
            _mm_store_ps(sc + s * 4, _mm_mul_ps(hsum4x8(a0, a1, a2, a3), scv));
        }
        /* block max per query (layout [s][j]: lane j%4 is query j) */
        __m128 bm = _mm_load_ps(sc);
        for (s = 1; s < n; s++) bm = _mm_max_ps(bm, _mm_load_ps(sc + s * 4));
        __m128 mnew = _mm_max_ps(mrun, bm);
        /* alpha = exp(mrun - mnew); first block: exp(-inf) -> 0 via the exp clamp */
        __m128 alpha = _mm256_castps256_ps128(exp256_ps(_mm256_castps128_ps256(_mm_sub_ps(mrun, mnew))));
        mrun = mnew;
        __m256 mv = _mm256_set_m128(mnew, mnew);
        __m256 sum = _mm256_setzero_ps();
        for (s = 0; s + 2 <= n; s += 2) {
            __m256 e = exp256_ps(_mm256_sub_ps(_mm256_load_ps(sc + s * 4), mv));
            _mm256_store_ps(sc + s * 4, e);
            sum = _mm256_add_ps(sum, e);
        }
        __m128 bsum = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
        if (s < n) {
            __m128 e = _mm256_castps256_ps128(exp256_ps(_mm256_castps128_ps256(_mm_sub_ps(_mm_load_ps(sc + s * 4), mnew))));
            _mm_store_ps(sc + s * 4, e);
            bsum = _mm_add_ps(bsum, e);
        }
        lrun = _mm_add_ps(_mm_mul_ps(lrun, alpha), bsum);
        float al[4];
        _mm_storeu_ps(al, alpha);
        const __m256 al0 = _mm256_set1_ps(al[0]), al1 = _mm256_set1_ps(al[1]);
        const __m256 al2 = _mm256_set1_ps(al[2]), al3 = _mm256_set1_ps(al[3]);
        float *c0 = acc, *c1 = acc + D, *c2 = acc + 2 * D, *c3 = acc + 3 * D;
        /* P.V over this block, 16-wide D slices held in registers */
        int64_t d = 0;
        for (; d + 16 <= D; d += 16) {
            __m256 x0 = _mm256_mul_ps(_mm256_loadu_ps(c0 + d), al0), y0 = _mm256_mul_ps(_mm256_loadu_ps(c0 + d + 8), al0);
            __m256 x1 = _mm256_mul_ps(_mm256_loadu_ps(c1 + d), al1), y1 = _mm256_mul_ps(_mm256_loadu_ps(c1 + d + 8), al1);
            __m256 x2 = _mm256_mul_ps(_mm256_loadu_ps(c2 + d), al2), y2 = _mm256_mul_ps(_mm256_loadu_ps(c2 + d + 8), al2);
            __m256 x3 = _mm256_mul_ps(_mm256_loadu_ps(c3 + d), al3), y3 = _mm256_mul_ps(_mm256_loadu_ps(c3 + d + 8), al3);
            for (s = 0; s < n; s++) {
                const kv_t *vr = vb + s * R;
                __m256 va = KV_LOAD(vr, d), vc = KV_LOAD(vr, d + 8);
                const float *ps = sc + s * 4;
                __m256 p0 = _mm256_broadcast_ss(ps), p1 = _mm256_broadcast_ss(ps + 1);
                x0 = _mm256_fmadd_ps(p0, va, x0); y0 = _mm256_fmadd_ps(p0, vc, y0);
                x1 = _mm256_fmadd_ps(p1, va, x1); y1 = _mm256_fmadd_ps(p1, vc, y1);
                __m256 p2 = _mm256_broadcast_ss(ps + 2), p3 = _mm256_broadcast_ss(ps + 3);
                x2 = _mm256_fmadd_ps(p2, va, x2); y2 = _mm256_fmadd_ps(p2, vc, y2);
                x3 = _mm256_fmadd_ps(p3, va, x3); y3 = _mm256_fmadd_ps(p3, vc, y3);
            }
            _mm256_storeu_ps(c0 + d, x0); _mm256_storeu_ps(c0 + d + 8, y0);
            _mm256_storeu_ps(c1 + d, x1); _mm256_storeu_ps(c1 + d + 8, y1);
            _mm256_storeu_ps(c2 + d, x2); _mm256_storeu_ps(c2 + d + 8, y2);
            _mm256_storeu_ps(c3 + d, x3); _mm256_storeu_ps(c3 + d + 8, y3);
        }
        for (; d < D; d += 8) {
            __m256i m = tailmask(D - d < 8 ? D - d : 8);
            __m256 x0 = _mm256_mul_ps(_mm256_maskload_ps(c0 + d, m), al0);
            __m256 x1 = _mm256_mul_ps(_mm256_maskload_ps(c1 + d, m), al1);
            __m256 x2 = _mm256_mul_ps(_mm256_maskload_ps(c2 + d, m), al2);
            __m256 x3 = _mm256_mul_ps(_mm256_maskload_ps(c3 + d, m), al3);
            for (s = 0; s < n; s++) {
                __m256 va = KV_MASKLOAD(vb + s * R, d, m, D - d < 8 ? D - d : 8);
                const float *ps = sc + s * 4;
                x0 = _mm256_fmadd_ps(_mm256_broadcast_ss(ps), va, x0);
                x1 = _mm256_fmadd_ps(_mm256_broadcast_ss(ps + 1), va, x1);
                x2 = _mm256_fmadd_ps(_mm256_broadcast_ss(ps + 2), va, x2);
                x3 = _mm256_fmadd_ps(_mm256_broadcast_ss(ps + 3), va, x3);
            }
            _mm256_maskstore_ps(c0 + d, m, x0);
            _mm256_maskstore_ps(c1 + d, m, x1);
            _mm256_maskstore_ps(c2 + d, m, x2);
            _mm256_maskstore_ps(c3 + d, m, x3);
        }
    }
    float l[4], mr[4];
    _mm_storeu_ps(l, lrun);
    _mm_storeu_ps(mr, mrun);
    for (int j = 0; j < nq; j++) {
        float f = 1.0f / l[j];
        if (sink) {  /* m = max(mrun, sink): e^(mrun-m) rescales the keys' sum and values */
            const float m = sink[j] > mr[j] ? sink[j] : mr[j], a = expf(mr[j] - m);
            f = a / (l[j] * a + expf(sink[j] - m));
        }
        const __m256 inv = _mm256_set1_ps(f);
        const float *cj = acc + j * D;
        int64_t d = 0;
        for (; d < D8; d += 8) _mm256_storeu_ps(o[j] + d, _mm256_mul_ps(_mm256_loadu_ps(cj + d), inv));
        if (d < D) _mm256_maskstore_ps(o[j] + d, dm, _mm256_mul_ps(_mm256_maskload_ps(cj + d, dm), inv));
    }
}

/* decode_quad_sinks without sinks (decode_attention's quad). */
static STRATA_UNUSED void decode_quad(float *const o[4], const float *const qp[4], const kv_t *kh,
                        const kv_t *vh, int64_t S, int64_t D, float scale, int nq, float *acc) {
    decode_quad_sinks(o, qp, kh, vh, S, D, scale, nq, acc, NULL);
}

/* attention_cached's, attention_window's and attention_sinks' work item
   `item` = ((g * quads + quad) * T + t): queries of heads g*G + 4*quad + j, row t, over keys
   0..P+t of kv head g — or, with a window W > 0, over its last W keys only (rows
   P+t-W+1..P+t; earlier rows never touched); sinks: NULL or [H], head h's sink logit. */
static STRATA_UNUSED void cached_item(float *out, const float *q, const kv_t *k,
                                      const kv_t *v, const float *sinks, int64_t H,
                                      int64_t Hkv, int64_t T, int64_t C, int64_t D, int64_t P,
                                      int64_t W, float scale, int64_t item, int64_t quads,
                                      float *acc) {
    const int64_t G = H / Hkv, t = item % T, gq = item / T, g = gq / quads;
    const int64_t j0 = (gq % quads) * 4, end = P + t + 1;
    const int64_t lo = W > 0 && end > W ? end - W : 0;
    const int nq = (int)(G - j0 < 4 ? G - j0 : 4);
    float *o[4], sk[4];
    const float *qp[4];
    for (int j = 0; j < 4; j++) {  /* padding lanes repeat the last query; not stored */
        const int64_t h = g * G + j0 + (j < nq ? j : nq - 1);
        o[j] = out + (h * T + t) * D;
        qp[j] = q + (h * T + t) * D;
        sk[j] = sinks ? sinks[h] : 0.0f;
    }
    decode_quad_sinks(o, qp, k + (g * C + lo) * KV_ROW(D), v + (g * C + lo) * KV_ROW(D),
                      end - lo, D, scale, nq, acc, sinks ? sk : NULL);
}


/* Below this many multiply-adds cached_attention stays on one thread (a fork-join costs
   microseconds on a quiet machine, much more when the cores are shared). */
#ifndef CACHED_MIN_WORK
#define CACHED_MIN_WORK ((int64_t)1 << 18)
#endif

/* attention_cached (W = 0), attention_window (W > 0) and attention_sinks (either, sinks
   [H]; NULL: none): every work item, in parallel (OpenMP, over heads and query rows) when
   the work amortises a team; every item is computed the same way on any thread, so results
   do not depend on the thread count. */
static STRATA_UNUSED void cached_attention_sinks(float *out, const float *q, const kv_t *k,
                                                 const kv_t *v, const float *sinks,
                                                 int64_t P, int64_t W, int64_t H, int64_t Hkv,
                                                 int64_t T, int64_t C, int64_t D, float scale) {
    if (H <= 0 || T <= 0 || D <= 0 || Hkv <= 0) return;
    const int64_t G = H / Hkv, quads = (G + 3) / 4, items = Hkv * quads * T;
    const int64_t keys = W > 0 ? T * (W < P + 1 ? W : P + 1) : T * P + T * (T + 1) / 2;
    if (items < 2 || H * D * keys < CACHED_MIN_WORK) {
        float *acc = (float *)malloc((size_t)(4 * D) * sizeof(float));
        if (!acc) return;
        for (int64_t it = 0; it < items; it++)
            cached_item(out, q, k, v, sinks, H, Hkv, T, C, D, P, W, scale, it, quads, acc);
        free(acc);
        return;
    }
#pragma omp parallel
    {
        float *acc = (float *)malloc((size_t)(4 * D) * sizeof(float));
        /* consecutive items share a kv head (locality); causal rows differ in cost */
#pragma omp for schedule(dynamic, 4)
        for (int64_t it = 0; it < items; it++)
            if (acc) cached_item(out, q, k, v, sinks, H, Hkv, T, C, D, P, W, scale, it,
                                 quads, acc);
        free(acc);
    }
}

/* cached_attention_sinks without sinks (attention_cached, attention_window). */
static STRATA_UNUSED void cached_attention(float *out, const float *q, const kv_t *k,
                                           const kv_t *v, int64_t P, int64_t W, int64_t H,
                                           int64_t Hkv, int64_t T, int64_t C, int64_t D,
                                           float scale) {
    cached_attention_sinks(out, q, k, v, NULL, P, W, H, Hkv, T, C, D, scale);
}

#endif /* STRATA_ATTENTION_H */
