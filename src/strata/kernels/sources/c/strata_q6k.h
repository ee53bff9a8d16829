/* strata_q6k.h: the portable q6_K super-block dot with ggml's numerics (vec_dot_q6_K_q8_K),
 * shared by linear_q6_K.naive.c and linear_q6_Kx8.naive.c. Hashed with each user.
 * A q6_K super-block is 210 bytes: ql[128], qh[64], int8 scales[16], fp16 d (last). Half h
 * (0, 1) uses ql[64h..64h+63] and qh[32h..32h+31]: for l < 32, weights 128h+l, +32, +64, +96
 * take ql[l] & 15, ql[l+32] & 15, ql[l] >> 4, ql[l+32] >> 4 as low bits and bits 0-1, 2-3,
 * 4-5, 6-7 of qh[l] as high bits; weight v's scale is scales[v / 16]. */
#ifndef STRATA_Q6K_H
#define STRATA_Q6K_H

#include "strata_half.h"
#include "strata_q8k.h"

static inline float q6k_superblock(const uint8_t *p, const q8k_block *y) {
    const int8_t *scales = (const int8_t *)(p + 192);
    const float d = half_to_float((uint16_t)(p[208] | (p[209] << 8)));
    int32_t sub[16] = {0};
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = p + 64 * h, *qh = p + 128 + 32 * h;
        const int8_t *q = y->q + 128 * h;
        for (int l = 0; l < 32; l++) {
            const int32_t q1 = (int32_t)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            const int32_t q2 = (int32_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            const int32_t q3 = (int32_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            const int32_t q4 = (int32_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            sub[8 * h + (l + 0) / 16] += q1 * q[l];
            sub[8 * h + (l + 32) / 16] += q2 * q[l + 32];
            sub[8 * h + (l + 64) / 16] += q3 * q[l + 64];
            sub[8 * h + (l + 96) / 16] += q4 * q[l + 96];
        }
    }
    int32_t sumi = 0;
    for (int j = 0; j < 16; j++) sumi += scales[j] * sub[j];
    return (y->d * d) * (float)sumi;
}

#endif
