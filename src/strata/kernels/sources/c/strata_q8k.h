/* strata_q8k.h: ggml's q8_K activation blocks for the K-quant linear kernels (linear_q4_K,
 * linear_q5_K, linear_q6_K), portable C. Hashed with each user like strata_half.h.
 *
 * quantize_row_q8_K_ref: per 256 values, max = the first value of largest |x|; all zero ->
 * d = 0 and q = 0; else iscale = -127/max (float32), q = min(127, round_half_even(iscale*x))
 * (float32 product), d = 1/iscale (float32: not max/127), bsums = sums of 16 consecutive q. */
#ifndef STRATA_Q8K_H
#define STRATA_Q8K_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define QK_K 256

typedef struct {
    float d;
    int8_t q[QK_K];
    int16_t bsums[QK_K / 16];
} q8k_block;

static inline void q8k_quantize(const float *x, q8k_block *y) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < QK_K; j++) {
        const float ax = fabsf(x[j]);
        if (ax > amax) { amax = ax; max = x[j]; }
    }
    if (amax == 0.0f) {
        memset(y, 0, sizeof *y);
        return;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < QK_K; j++) {
        const int v = (int)nearbyintf(iscale * x[j]);  /* half to even (default mode) */
        y->q[j] = (int8_t)(v > 127 ? 127 : v);
    }
    for (int s = 0; s < QK_K / 16; s++) {
        int sum = 0;
        for (int j = 0; j < 16; j++) sum += y->q[16 * s + j];
        y->bsums[s] = (int16_t)sum;
    }
    y->d = 1.0f / iscale;
}

/* Every 256-block of the B rows of x [B, K] -> q8_K (malloc'd by the caller: B*K/256). */
static inline void q8k_quantize_rows(const float *x, q8k_block *y, int64_t B, int64_t K) {
    const int64_t n = B * (K / QK_K);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) q8k_quantize(x + i * QK_K, y + i);
}

/* q4_K / q5_K packed 6-bit scales and mins of sub-block j (ggml's get_scale_min_k4). */
static inline void q8k_scale_min(int j, const uint8_t *s, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* One q4_K (five = 0) or q5_K (five = 1: qh[32] before the nibbles) super-block against x's
 * q8_K block (ggml's vec_dot_q4_K/q5_K_q8_K, one super-block). */
static inline float q8k_superblock_45(const uint8_t *p, const q8k_block *y, int five) {
    const float d = half_to_float((uint16_t)(p[0] | (p[1] << 8)));
    const float dmin = half_to_float((uint16_t)(p[2] | (p[3] << 8)));
    const uint8_t *qh = p + 16, *qs = p + (five ? 48 : 16);
    int32_t sumi = 0, summ = 0;
    for (int c = 0; c < 4; c++) {
        int sc_lo, m_lo, sc_hi, m_hi;
        q8k_scale_min(2 * c, p + 4, &sc_lo, &m_lo);
        q8k_scale_min(2 * c + 1, p + 4, &sc_hi, &m_hi);
        int32_t lo = 0, hi = 0;
        for (int l = 0; l < 32; l++) {
            const int32_t q_lo = (qs[32 * c + l] & 0xF) | (five ? ((qh[l] >> (2 * c)) & 1) << 4 : 0);
            const int32_t q_hi = (qs[32 * c + l] >> 4) | (five ? ((qh[l] >> (2 * c + 1)) & 1) << 4 : 0);
            lo += q_lo * y->q[64 * c + l];
            hi += q_hi * y->q[64 * c + 32 + l];
        }
        sumi += sc_lo * lo + sc_hi * hi;
        summ += m_lo * (y->bsums[4 * c] + y->bsums[4 * c + 1]) +
                m_hi * (y->bsums[4 * c + 2] + y->bsums[4 * c + 3]);
    }
    const float dd = y->d * d, dm = y->d * dmin;
    return dd * (float)sumi - dm * (float)summ;
}

/* out[b, n] = sum over the K/256 super-blocks of superblock(weight row n's block, x row b's
 * q8_K block), accumulated in float32 (the portable K-quant kernels: x quantised once,
 * weight rows over OpenMP threads, each output one thread's fixed-order sum). */
typedef float (*q8k_superblock_fn)(const uint8_t *p, const q8k_block *y);

/* q4_K's super-block dot (q8k_superblock_45 without a fifth bit), as a q8k_superblock_fn */
static inline float q8k_superblock_q4k(const uint8_t *p, const q8k_block *y) {
    return q8k_superblock_45(p, y, 0);
}

static inline void q8k_linear(float *out, const float *x, const uint8_t *w, int64_t B,
                              int64_t N, int64_t K, int64_t block_bytes,
                              q8k_superblock_fn superblock) {
    const int64_t nsb = K / QK_K;
    q8k_block *qx = malloc((size_t)(B * nsb + 1) * sizeof(q8k_block));
    if (!qx) return;  /* out stays NaN: fails loudly */
    q8k_quantize_rows(x, qx, B, K);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *row = w + n * nsb * block_bytes;
        for (int64_t b = 0; b < B; b++) {
            float sum = 0.0f;
            for (int64_t s = 0; s < nsb; s++)
                sum += superblock(row + s * block_bytes, qx + b * nsb + s);
            out[b * N + n] = sum;
        }
    }
    free(qx);
}

#endif
