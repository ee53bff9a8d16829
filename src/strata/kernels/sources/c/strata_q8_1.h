/* strata_q8_1.h: ggml's q8_1 activation blocks and the portable driver of the linear kernels
 * whose weight blocks carry a min (q4_1, q5_1: value d*q + m, q unsigned), portable C.
 * Hashed with each user like strata_half.h.
 *
 * q8_1 as ggml's AVX2 quantize_row_q8_1: amax = max |x|, d = amax / 127 (float32), the
 * stored d_x = fp16(d), id = amax ? 127 / amax : 0 (float32), q_x = round_half_even(x * id),
 * s_x = fp16(d * sum q_x) (the float32 d, not its fp16 rounding). A block's dot is
 * f32(d_w)*d_x * sum q_w*q_x + f32(m_w)*s_x (ggml's vec_dot_q4_1_q8_1). */
#ifndef STRATA_Q8_1_H
#define STRATA_Q8_1_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include "strata_half.h"

#define QK8_1 32

typedef struct {
    int8_t q[QK8_1];
    float d;  /* fp16(amax / 127), as float32 */
    float s;  /* fp16(amax / 127 * sum q), as float32 */
} q8_1_block;

static inline void q8_1_quantize(const float *x, q8_1_block *y) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_1; j++) {
        const float a = fabsf(x[j]);
        if (a > amax) amax = a;
    }
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < QK8_1; j++) {
        y->q[j] = (int8_t)nearbyintf(x[j] * id);  /* half to even (default mode) */
        sum += y->q[j];
    }
    y->d = half_to_float(float_to_half(d));
    y->s = half_to_float(float_to_half(d * (float)sum));
}

/* sum_j q_w[j] * q_x[j] of one weight block (unsigned q_w) against one q8_1 block. */
typedef int32_t (*q8_1_dot_fn)(const uint8_t *p, const int8_t *q);

/* out[b, n] = sum over the K/32 blocks of f32(d_w)*d_x*dot + f32(m_w)*s_x (d_w, m_w the
 * block's first two fp16 values), float32 sums in block order; x quantised once, weight rows
 * over OpenMP threads. */
static inline void q8_1_linear(float *out, const float *x, const uint8_t *w, int64_t B,
                               int64_t N, int64_t K, int64_t block_bytes, q8_1_dot_fn dot) {
    const int64_t nb = K / QK8_1;
    q8_1_block *qx = malloc((size_t)(B * nb + 1) * sizeof(q8_1_block));
    if (!qx) return;  /* out stays NaN: fails loudly */
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < B * nb; i++) q8_1_quantize(x + i * QK8_1, qx + i);
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < N; n++) {
        const uint8_t *row = w + n * nb * block_bytes;
        for (int64_t b = 0; b < B; b++) {
            float sum = 0.0f;
            for (int64_t blk = 0; blk < nb; blk++) {
                const uint8_t *p = row + blk * block_bytes;
                const q8_1_block *y = qx + b * nb + blk;
                const float d = half_to_float((uint16_t)(p[0] | (p[1] << 8))) * y->d;
                const float m = half_to_float((uint16_t)(p[2] | (p[3] << 8)));
                sum += d * (float)dot(p, y->q) + m * y->s;
            }
            out[b * N + n] = sum;
        }
    }
    free(qx);
}

#endif
