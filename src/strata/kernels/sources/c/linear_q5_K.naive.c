// strata-kernel: op=linear_q5_K dialect=c entry=strata_linear_q5_K
/* Reference GGUF q5_K linear layer with ggml's numerics, portable C (ggml's
 * vec_dot_q5_K_q8_K): x's rows quantised to q8_K (strata_q8k.h), then per 256-value
 * super-block
 *   f32(d_x*d) * sum_j sc_j * sum_v q_v*q_x  -  f32(d_x*dmin) * sum_j m_j * (bsum_2j + bsum_2j+1)
 * with the integer sums exact, accumulated in float32 over the super-blocks.
 * A q5_K super-block is 176 bytes: fp16 d, fp16 dmin, 12 bytes of packed 6-bit scales and
 * mins, qh[32] (the fifth bit: bit 2c of qh[l] for weight 64c+l, bit 2c+1 for 64c+32+l),
 * then 128 bytes of nibbles laid out as q4_K's. Rows over OpenMP threads. */
#include "strata_half.h"
#include "strata_q8k.h"

#define BLOCK_BYTES 176

static float superblock(const uint8_t *p, const q8k_block *y) {
    const float d = half_to_float((uint16_t)(p[0] | (p[1] << 8)));
    const float dmin = half_to_float((uint16_t)(p[2] | (p[3] << 8)));
    const uint8_t *qh = p + 16, *qs = p + 48;
    int32_t sumi = 0, summ = 0;
    for (int c = 0; c < 4; c++) {
        int sc_lo, m_lo, sc_hi, m_hi;
        q8k_scale_min(2 * c, p + 4, &sc_lo, &m_lo);
        q8k_scale_min(2 * c + 1, p + 4, &sc_hi, &m_hi);
        int32_t lo = 0, hi = 0;
        for (int l = 0; l < 32; l++) {
            const int32_t q_lo = (qs[32 * c + l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4);
            const int32_t q_hi = (qs[32 * c + l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
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

void strata_linear_q5_K(float *out, const float *x, const uint8_t *w,
                        int64_t B, int64_t N, int64_t K) {
    q8k_linear(out, x, w, B, N, K, BLOCK_BYTES, superblock);
}
