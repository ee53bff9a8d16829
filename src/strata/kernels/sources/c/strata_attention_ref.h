/* strata_attention_ref.h: the portable reference (`naive`) of attention over a float16 or
 * q8_0 KV cache that attention_cached, attention_window and attention_sinks's _f16 and _q8_0
 * twins share (the float32-cache naive kernels keep their own loops, as written before this
 * header). Portable C, no SIMD; float16 read with strata_half.h. Hashed with each user like
 * strata_simd.h. */
#ifndef STRATA_ATTENTION_REF_H
#define STRATA_ATTENTION_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "strata_half.h"

#define STRATA_REF_UNUSED __attribute__((unused))

/* Value i of cache row `row` (kv head g's row s is g*C + s) of a cache of D-value rows. */
typedef float (*kv_read_fn)(const void *cache, int64_t row, int64_t i, int64_t D);

/* float16 rows: D values each */
static STRATA_REF_UNUSED float kv_read_half(const void *cache, int64_t row, int64_t i,
                                            int64_t D) {
    return half_to_float(((const uint16_t *)cache)[row * D + i]);
}

/* GGUF q8_0 rows: D/32 blocks of 34 bytes (fp16 scale d, 32 int8 q), value d*q */
static STRATA_REF_UNUSED float kv_read_q8_0(const void *cache, int64_t row, int64_t i,
                                            int64_t D) {
    const uint8_t *b = (const uint8_t *)cache + row * (D / 32 * 34) + (i / 32) * 34;
    uint16_t d;
    memcpy(&d, b, 2);
    return half_to_float(d) * (float)(int8_t)b[2 + i % 32];
}

/* q [H,T,D] float; k, v [Hkv,C,row] rows `read` decodes; P cache rows precede the T queries
 * (P + T <= C). Query t of head h attends rows lo..P+t of kv head h / (H/Hkv), lo =
 * max(0, P+t-W+1) for a window W > 0, else 0; no other row is read. sinks: NULL, or [H] a
 * logit per head that joins the softmax's max and sum only (no value, not scaled), as
 * ggml's soft_max with sinks. Softmax in double, max subtracted. */
static STRATA_REF_UNUSED void attention_ref_kv(float *out, const float *q, const void *k,
                                               const void *v, kv_read_fn read,
                                               const float *sinks, int64_t P, int64_t W,
                                               int64_t H, int64_t Hkv, int64_t T, int64_t C,
                                               int64_t D, float scale) {
    if (H <= 0 || T <= 0 || D <= 0 || Hkv <= 0) return;
    const int64_t group = H / Hkv, most = W > 0 && W < P + T ? W : P + T;
    double *p = (double *)malloc((size_t)most * sizeof(double));
    double *acc = (double *)malloc((size_t)D * sizeof(double));
    if (!p || !acc) { free(p); free(acc); return; }
    for (int64_t h = 0; h < H; h++) {
        const int64_t base = (h / group) * C;  /* row 0 of this head's kv head */
        for (int64_t t = 0; t < T; t++) {
            const float *qr = q + (h * T + t) * D;
            const int64_t end = P + t + 1, lo = W > 0 && end > W ? end - W : 0;
            double m = -INFINITY;
            for (int64_t s = lo; s < end; s++) {
                double d = 0.0;
                for (int64_t i = 0; i < D; i++) d += (double)qr[i] * read(k, base + s, i, D);
                p[s - lo] = d * scale;
                if (p[s - lo] > m) m = p[s - lo];
            }
            const double sink = sinks ? (double)sinks[h] : -INFINITY;
            if (sink > m) m = sink;
            double sum = sinks ? exp(sink - m) : 0.0;
            for (int64_t s = 0; s < end - lo; s++) { p[s] = exp(p[s] - m); sum += p[s]; }
            for (int64_t i = 0; i < D; i++) acc[i] = 0.0;
            for (int64_t s = lo; s < end; s++)
                for (int64_t i = 0; i < D; i++) acc[i] += p[s - lo] * read(v, base + s, i, D);
            float *o = out + (h * T + t) * D;
            for (int64_t i = 0; i < D; i++) o[i] = (float)(acc[i] / sum);
        }
    }
    free(p);
    free(acc);
}

/* attention_ref_kv over float16 rows (the *_f16 naive kernels) */
static STRATA_REF_UNUSED void attention_ref_half(float *out, const float *q, const uint16_t *k,
                                                 const uint16_t *v, const float *sinks,
                                                 int64_t P, int64_t W, int64_t H, int64_t Hkv,
                                                 int64_t T, int64_t C, int64_t D, float scale) {
    attention_ref_kv(out, q, k, v, kv_read_half, sinks, P, W, H, Hkv, T, C, D, scale);
}

#endif /* STRATA_ATTENTION_REF_H */
